//! `provm blame --svg FILE`: a stacked bar per process (where its time
//! went) and a cumulative distribution of exit latency per device, drawn
//! as plain SVG.

use std::fmt::Write;

use provm_engine::timing::report::{bucket_bound_ns, TimingReport, BUCKETS};

use super::table::{self, Row, ESTIMATED, MEASURED};

const WIDTH: f64 = 900.0;
const LABEL: f64 = 220.0;
const BAR: f64 = 18.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

/// The parts of a bar, in drawing order.
const PARTS: [(&str, &str); 5] = [
    ("guest", "#4e79a7"),
    ("VMM", "#e15759"),
    ("injected (of VMM)", "#b07aa1"),
    ("recorder", "#f28e2b"),
    ("halted", "#bab0ac"),
];

fn parts(row: &Row) -> [u64; 5] {
    [
        row.guest_ns,
        row.vmm_total_ns() - row.injected_ns,
        row.injected_ns,
        row.recorder_ns,
        row.halted_ns,
    ]
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn render(report: &TimingReport) -> String {
    let (rows, _) = table::rows(report);
    let devices = report.by_device();
    let bars_height = 60.0 + rows.len() as f64 * (BAR + 6.0);
    let cdf_top = bars_height + 40.0;
    let cdf_height = 260.0;
    let height = cdf_top + cdf_height + 120.0 + 16.0 * devices.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-size="15">Hypervisor blame per guest process ({}), host time</text>"#,
        escape(&report.mode)
    );
    // The legend of the bars.
    for (index, (name, colour)) in PARTS.iter().enumerate() {
        let x = LABEL + index as f64 * 110.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{colour}"/><text x="{}" y="40">{name}</text>"#,
            x + 16.0
        );
    }
    let longest = rows.iter().map(|r| r.wall_ns).max().unwrap_or(1).max(1) as f64;
    let scale = (WIDTH - LABEL - 230.0) / longest;
    for (index, row) in rows.iter().enumerate() {
        let y = 56.0 + index as f64 * (BAR + 6.0);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{} {}</text>"#,
            LABEL - 8.0,
            y + 13.0,
            row.pid.unwrap_or(-1),
            escape(&row.command)
        );
        let mut x = LABEL;
        for (ns, (name, colour)) in parts(row).iter().zip(PARTS) {
            let w = *ns as f64 * scale;
            if w > 0.0 {
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x:.2}" y="{y}" width="{w:.2}" height="{BAR}" fill="{colour}"><title>{name}: {} ms</title></rect>"#,
                    table::ms(*ns)
                );
            }
            x += w;
        }
        // The hypervisor's share is often too thin to see: say it.
        let hypervisor = row.vmm_total_ns() + row.recorder_ns;
        let _ = writeln!(
            svg,
            r#"<text x="{:.2}" y="{}">{} ms, hypervisor {} ms</text>"#,
            x + 4.0,
            y + 13.0,
            table::ms(row.wall_ns),
            table::ms(hypervisor)
        );
    }
    cdfs(&mut svg, &devices, cdf_top, cdf_height);
    let notes_top = cdf_top + cdf_height + 40.0 + 16.0 * devices.len() as f64;
    for (index, note) in [MEASURED, ESTIMATED].iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}" font-size="9">{}</text>"#,
            notes_top + 14.0 * index as f64,
            escape(note)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Exit latency CDFs, one line per device, on a log time axis.
fn cdfs(
    svg: &mut String,
    devices: &std::collections::BTreeMap<String, provm_engine::timing::report::DeviceTiming>,
    top: f64,
    height: f64,
) {
    let (left, right) = (70.0, WIDTH - 30.0);
    let bottom = top + height;
    let _ = writeln!(
        svg,
        r#"<text x="10" y="{}" font-size="15">Exit latency by device (cumulative; VMM + recorder)</text>"#,
        top - 10.0
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{}" height="{height}" fill="none" stroke="#888"/>"##,
        right - left
    );
    let x_of = |bucket: usize| left + (right - left) * bucket as f64 / (BUCKETS - 1) as f64;
    for bucket in (0..BUCKETS).step_by(3) {
        let ns = bucket_bound_ns(bucket);
        let label = if ns >= 1_000_000_000 {
            format!("{}s", ns / 1_000_000_000)
        } else if ns >= 1_000_000 {
            format!("{}ms", ns / 1_000_000)
        } else {
            format!("{}us", ns / 1000)
        };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            x_of(bucket),
            bottom + 15.0
        );
    }
    for fraction in [0.0, 0.5, 1.0] {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{fraction}</text>"#,
            left - 6.0,
            bottom - height * fraction + 4.0
        );
    }
    for (index, (name, device)) in devices.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let total: u64 = device.latency.iter().sum();
        if total == 0 {
            continue;
        }
        let mut seen = 0;
        let points: Vec<String> = device
            .latency
            .iter()
            .enumerate()
            .map(|(bucket, n)| {
                seen += n;
                let y = bottom - height * seen as f64 / total as f64;
                format!("{:.1},{y:.1}", x_of(bucket))
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let y = bottom + 36.0 + 16.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{left}" y="{}" width="12" height="4" fill="{colour}"/><text x="{}" y="{y}">{} ({} exits)</text>"#,
            y - 5.0,
            left + 18.0,
            escape(name),
            device.exits
        );
    }
}

//! Where provm's log and the engine's notices go: stderr, the log filtered
//! by `-v` (or `PROVM_LOG`), the notices always.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

pub fn init(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROVM_LOG")
        .unwrap_or_else(|_| level.into())
        // Shown by `Notices`, whatever the level.
        .add_directive(
            format!("{}=off", provm_engine::NOTICE)
                .parse()
                .expect("a valid directive"),
        );
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let notices = Notices.with_filter(tracing_subscriber::filter::filter_fn(|meta| {
        meta.target() == provm_engine::NOTICE
    }));
    tracing_subscriber::registry()
        .with(log)
        .with(notices)
        .init();
}

/// Prints the engine's notices (`provm_engine::notice!`) as `provm: MESSAGE`
/// lines on stderr.
struct Notices;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        eprintln!("provm: {}", message.0);
    }
}

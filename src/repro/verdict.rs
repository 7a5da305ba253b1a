//! `provm repro`'s one-line verdict: reproducible, or what differs and
//! which input class is the cause.

use std::fmt;

use super::InputClass;

pub enum Verdict {
    /// `runs` runs gave the same results; `varied` says with which inputs
    /// varied (none: a pinned repro).
    Reproducible {
        runs: usize,
        varied: bool,
        files: usize,
    },
    Irreproducible {
        /// What differs between the first run and the first that differed.
        differences: Vec<String>,
        cause: Cause,
    },
}

/// Which input classes the difference comes from, found by re-running with
/// one class pinned (held at the first run's value) at a time.
pub enum Cause {
    /// Pinning each of these alone makes the runs agree; the others do not.
    Pinned {
        stable: Vec<InputClass>,
        not: Vec<InputClass>,
    },
    /// No class pinned alone makes the runs agree, and with all pinned they
    /// do: each class varies the results on its own.
    Each,
    /// The runs differ with every input pinned: provm let something else in.
    Provm,
    /// Inputs were pinned already (`--pinned`): nothing was varied, so the
    /// difference is provm's own.
    PinnedRepro,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Reproducible {
                runs,
                varied,
                files,
            } => {
                let how = if *varied {
                    "with the clock and entropy varied"
                } else {
                    "with every input pinned"
                };
                write!(f, "reproducible: {runs} runs {how} gave the same exit status, stdout, stderr and {files} files written")
            }
            Verdict::Irreproducible { differences, cause } => {
                write!(f, "irreproducible: {}; {cause}", differences.join(", "))
            }
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |classes: &[InputClass]| {
            classes
                .iter()
                .map(|class| class.name())
                .collect::<Vec<_>>()
                .join(" and ")
        };
        match self {
            Cause::Pinned { stable, not } => {
                let pinned = stable
                    .iter()
                    .map(|class| format!("the {} is pinned", class.name()))
                    .collect::<Vec<_>>()
                    .join(", or when ");
                let together = if stable.len() > 1 { " together" } else { "" };
                write!(
                    f,
                    "cause: {}{together} (stable when {pinned})",
                    names(stable)
                )?;
                if !not.is_empty() {
                    write!(f, "; not: {}", names(not))?;
                }
                Ok(())
            }
            Cause::Each => write!(
                f,
                "cause: {} (each varies the results: neither pinned alone makes them stable)",
                names(&InputClass::ALL)
            ),
            Cause::Provm => write!(
                f,
                "cause: provm itself (the runs differ with every input pinned; please report it)"
            ),
            Cause::PinnedRepro => write!(
                f,
                "cause: provm itself (every input was pinned; please report it)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_read_as_one_line() {
        let clock = Verdict::Irreproducible {
            differences: vec!["/out/result.tar differs (written by tar, pid 41)".into()],
            cause: Cause::Pinned {
                stable: vec![InputClass::Clock],
                not: vec![InputClass::Entropy],
            },
        };
        assert_eq!(
            clock.to_string(),
            "irreproducible: /out/result.tar differs (written by tar, pid 41); cause: clock (stable when the clock is pinned); not: entropy"
        );
        let together = Cause::Pinned {
            stable: InputClass::ALL.to_vec(),
            not: Vec::new(),
        };
        assert_eq!(
            together.to_string(),
            "cause: clock and entropy together (stable when the clock is pinned, or when the entropy is pinned)"
        );
        let same = Verdict::Reproducible {
            runs: 2,
            varied: true,
            files: 0,
        };
        assert!(same
            .to_string()
            .starts_with("reproducible: 2 runs with the clock"));
    }
}

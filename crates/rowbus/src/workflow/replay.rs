//! The pure part of a replay: which recorded step a step of the running code is, and
//! whether the code still asks for the steps in the order and with the names recorded.

/// One recorded step, as read from the steps table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recorded {
    /// Its position in the workflow, from 0.
    pub seq: u32,
    /// The name the code gave it.
    pub name: String,
    /// Its state (see [`StepState`](super::StepState)'s strings).
    pub state: String,
    /// Its output as JSON (a wake time for a sleep or a wait), `None` for NULL.
    pub output: Option<String>,
    /// Its error, when it failed.
    pub error: Option<String>,
}

/// What a step of the running code is, against what was recorded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Replay<'a> {
    /// Nothing recorded at its position: run it.
    Fresh,
    /// Recorded under the same name: return what was recorded.
    Recorded(&'a Recorded),
    /// Recorded under another name: the code changed under a running workflow.
    Mismatch {
        /// The name recorded at this position.
        recorded: &'a str,
    },
}

/// The step at `seq` named `name`, against `recorded` (in `seq` order).
pub(crate) fn replay<'a>(recorded: &'a [Recorded], seq: u32, name: &str) -> Replay<'a> {
    match recorded.binary_search_by_key(&seq, |r| r.seq) {
        Err(_) => Replay::Fresh,
        Ok(i) if recorded[i].name == name => Replay::Recorded(&recorded[i]),
        Ok(i) => Replay::Mismatch { recorded: &recorded[i].name },
    }
}

/// Adds `step` to `recorded`, kept in `seq` order (a step recorded by another run of the
/// workflow meanwhile replaces nothing: the first record of a position stands).
pub(crate) fn remember(recorded: &mut Vec<Recorded>, step: Recorded) {
    if let Err(i) = recorded.binary_search_by_key(&step.seq, |r| r.seq) {
        recorded.insert(i, step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn step(seq: u32, name: &str) -> Recorded {
        Recorded { seq, name: name.into(), state: "done".into(), output: Some("1".into()), error: None }
    }

    #[test]
    fn a_step_past_the_record_is_fresh_and_one_recorded_returns_its_record() {
        let recorded = [step(0, "a"), step(1, "b")];
        assert_eq!(replay(&recorded, 1, "b"), Replay::Recorded(&recorded[1]));
        assert_eq!(replay(&recorded, 2, "c"), Replay::Fresh);
    }

    #[test]
    fn another_name_at_a_recorded_position_is_a_mismatch_naming_the_recorded_one() {
        let recorded = [step(0, "charge"), step(1, "ship")];
        assert_eq!(replay(&recorded, 1, "refund"), Replay::Mismatch { recorded: "ship" });
    }

    #[test]
    fn the_first_record_of_a_position_stands() {
        let mut recorded = vec![step(0, "a")];
        remember(&mut recorded, step(0, "other"));
        remember(&mut recorded, step(2, "c"));
        remember(&mut recorded, step(1, "b"));
        let names: Vec<&str> = recorded.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    proptest! {
        /// Replaying the names recorded, in order, finds every one of them recorded; a
        /// changed name at any position is a mismatch there and nowhere before.
        #[test]
        fn replaying_the_recorded_names_finds_them_and_a_change_is_caught_where_it_is(
            names in proptest::collection::vec("[a-c]{1,2}", 1..20),
            changed in any::<proptest::sample::Index>(),
        ) {
            let mut recorded = Vec::new();
            for (seq, name) in names.iter().enumerate() {
                remember(&mut recorded, step(seq as u32, name));
            }
            for (seq, name) in names.iter().enumerate() {
                prop_assert_eq!(replay(&recorded, seq as u32, name), Replay::Recorded(&recorded[seq]));
            }
            let at = changed.index(names.len());
            let other = format!("{}x", names[at]);
            for (seq, name) in names.iter().enumerate().take(at) {
                prop_assert!(matches!(replay(&recorded, seq as u32, name), Replay::Recorded(_)));
            }
            prop_assert_eq!(
                replay(&recorded, at as u32, &other),
                Replay::Mismatch { recorded: names[at].as_str() }
            );
            prop_assert_eq!(replay(&recorded, names.len() as u32, "next"), Replay::Fresh);
        }
    }
}

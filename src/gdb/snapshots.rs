//! The snapshots a replay under gdb takes as it goes, for time travel: one
//! every `every` log events, at most `limit` of them. When the store is
//! full, every other one is dropped (the first, the replay's start, stays)
//! and the interval doubles, so they always cover the whole replay so far
//! with bounded memory; going back costs at most one interval of
//! re-execution.

/// The snapshots, ascending by the log position they were taken at.
pub struct Snapshots<T> {
    every: u64,
    limit: usize,
    taken: Vec<(u64, T)>,
}

impl<T> Snapshots<T> {
    /// A store holding `first`, taken at event `at` (the replay's start).
    pub fn new(every: u64, limit: usize, at: u64, first: T) -> Self {
        assert!(
            every > 0 && limit >= 2,
            "time travel needs an interval and two snapshots"
        );
        Snapshots {
            every,
            limit,
            taken: vec![(at, first)],
        }
    }

    /// The interval between snapshots now, in log events.
    pub fn every(&self) -> u64 {
        self.every
    }

    pub fn len(&self) -> usize {
        self.taken.len()
    }

    /// The log position at which the next snapshot is due: one interval
    /// past the newest, so a replay that went back and goes forward again
    /// takes none until it passes the newest.
    pub fn next_due(&self) -> u64 {
        self.newest() + self.every
    }

    fn newest(&self) -> u64 {
        self.taken.last().expect("never empty").0
    }

    /// Keeps `snapshot`, taken at event `at`; ignored unless past the newest.
    pub fn add(&mut self, at: u64, snapshot: T) {
        if at <= self.newest() {
            return;
        }
        if self.taken.len() == self.limit {
            let mut index = 0;
            self.taken.retain(|_| {
                index += 1;
                index % 2 == 1
            });
            self.every *= 2;
        }
        self.taken.push((at, snapshot));
    }

    /// The newest snapshot taken before event `event` (strictly), with its
    /// position.
    pub fn before(&self, event: u64) -> Option<(u64, &T)> {
        self.taken
            .iter()
            .rev()
            .find(|(at, _)| *at < event)
            .map(|(at, snapshot)| (*at, snapshot))
    }

    /// The newest snapshot taken at or before event `event`.
    pub fn at_or_before(&self, event: u64) -> Option<(u64, &T)> {
        self.before(event.saturating_add(1))
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &T> {
        self.taken.iter().map(|(_, snapshot)| snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_due_one_interval_past_the_newest() {
        let mut store = Snapshots::new(100, 4, 0, ());
        assert_eq!(store.next_due(), 100);
        store.add(103, ());
        assert_eq!(store.next_due(), 203);
        // Going back and forward again adds nothing before the newest.
        store.add(50, ());
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn a_full_store_drops_every_other_snapshot_and_doubles_the_interval() {
        let mut store = Snapshots::new(10, 4, 0, 0);
        for at in [10, 20, 30] {
            store.add(at, at);
        }
        store.add(40, 40);
        assert_eq!(store.iter().copied().collect::<Vec<_>>(), [0, 20, 40]);
        assert_eq!(store.every(), 20);
        assert_eq!(store.next_due(), 60);
    }

    #[test]
    fn before_finds_the_newest_snapshot_strictly_earlier() {
        let mut store = Snapshots::new(10, 8, 0, "start");
        store.add(10, "ten");
        store.add(20, "twenty");
        assert_eq!(store.before(20), Some((10, &"ten")));
        assert_eq!(store.at_or_before(20), Some((20, &"twenty")));
        assert_eq!(store.before(0), None);
        assert_eq!(store.before(5), Some((0, &"start")));
    }
}

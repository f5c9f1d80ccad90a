//! The in-process collective of the CPU backend: the executors of a plan's ranks, one
//! thread each, meet at every collective step, each putting its values in its slot; once all
//! have, each reads every slot (the reduction order is the rank order, fixed), and they meet
//! again before the slots are reused. A rank that fails aborts the group, so the others
//! return an error instead of waiting for it. With tensor parallelism each executor is a
//! member of two groups: the data-parallel ranks holding its tensor slice, and its
//! replica's tensor ranks.

use super::ExecError;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The ranks of one data-parallel run; shared by their executors.
#[derive(Debug)]
pub struct Group {
    ranks: usize,
    slots: Mutex<Vec<Vec<f32>>>,
    meeting: Mutex<Meeting>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct Meeting {
    waiting: usize,
    generation: u64,
    aborted: bool,
}

fn poisoned<T>(_: T) -> ExecError {
    ExecError::Device("a rank of the in-process group panicked".into())
}

impl Group {
    /// A group of `ranks` ranks (at least 1), none arrived.
    pub fn new(ranks: usize) -> Group {
        Group {
            ranks: ranks.max(1),
            slots: Mutex::new(vec![Vec::new(); ranks.max(1)]),
            meeting: Mutex::new(Meeting::default()),
            arrived: Condvar::new(),
        }
    }

    /// How many ranks the group has.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Makes every rank waiting (now or later) return an error: a rank failed.
    pub fn abort(&self) {
        if let Ok(mut m) = self.meeting.lock() {
            m.aborted = true;
        }
        self.arrived.notify_all();
    }

    /// Returns once all ranks have called it (or with an error once the group is aborted).
    fn meet(&self) -> Result<(), ExecError> {
        let mut m: MutexGuard<Meeting> = self.meeting.lock().map_err(poisoned)?;
        if m.aborted {
            return Err(aborted());
        }
        let generation = m.generation;
        m.waiting += 1;
        if m.waiting == self.ranks {
            m.waiting = 0;
            m.generation += 1;
            self.arrived.notify_all();
            return Ok(());
        }
        while m.generation == generation && !m.aborted {
            m = self.arrived.wait(m).map_err(poisoned)?;
        }
        if m.aborted {
            return Err(aborted());
        }
        Ok(())
    }

    /// Rank `rank`'s part of one collective: puts `values` in its slot, and once every rank
    /// has put its own, calls `read` with all slots in rank order. Every rank must call it
    /// for the same collective in the same order (each runs the same plan).
    pub fn exchange(
        &self,
        rank: usize,
        values: &[f32],
        read: impl FnOnce(&[Vec<f32>]),
    ) -> Result<(), ExecError> {
        if rank >= self.ranks {
            return Err(ExecError::Unsupported(format!(
                "rank {rank} outside a group of {} ranks",
                self.ranks
            )));
        }
        {
            let mut slots = self.slots.lock().map_err(poisoned)?;
            slots[rank].clear();
            slots[rank].extend_from_slice(values);
        }
        self.meet()?;
        read(&self.slots.lock().map_err(poisoned)?);
        self.meet()
    }
}

impl super::cpu::CpuStep<'_> {
    /// The rank running this step of a plan over `ranks` ranks: its place in its group, or
    /// 0 for an executor of one rank, which runs only plans over one rank.
    pub fn rank(&self, ranks: usize) -> Result<usize, ExecError> {
        match self.member() {
            Some((rank, group)) if group.ranks() == ranks => Ok(rank),
            None if ranks == 1 => Ok(0),
            member => Err(ExecError::Unsupported(format!(
                "a collective over {ranks} ranks, run by {} rank(s): run the plan's ranks \
                 together (`memc run --parallel`, `exec::ranks::Ranks`)",
                member.map_or(1, |(_, g)| g.ranks())
            ))),
        }
    }

    /// This tensor rank's part of a tensor-parallel collective over `ranks` ranks
    /// ([`Group::exchange`] in its replica's tensor group); alone, `read` sees `values`.
    pub fn tensor_exchange(
        &self,
        ranks: usize,
        values: &[f32],
        read: impl FnOnce(&[Vec<f32>]),
    ) -> Result<(), ExecError> {
        match self.tensor_member() {
            member @ Some((_, group)) if group.ranks() == ranks => {
                exchange_in(member, values, read)
            }
            None if ranks == 1 => exchange_in(None, values, read),
            member => Err(ExecError::Unsupported(format!(
                "a tensor-parallel sum over {ranks} ranks, run by {} tensor rank(s): run the \
                 plan's ranks together (`memc run --parallel`, `exec::ranks::Ranks`)",
                member.map_or(1, |(_, g)| g.ranks())
            ))),
        }
    }

    /// This rank's part of a collective ([`Group::exchange`]); alone, `read` sees `values`.
    pub fn exchange(
        &self,
        values: &[f32],
        read: impl FnOnce(&[Vec<f32>]),
    ) -> Result<(), ExecError> {
        exchange_in(self.member(), values, read)
    }
}

/// `values` exchanged as rank `rank` of `group` when `member` is `Some((rank, group))`;
/// alone, `read` sees `values`.
fn exchange_in(
    member: Option<(usize, &Group)>,
    values: &[f32],
    read: impl FnOnce(&[Vec<f32>]),
) -> Result<(), ExecError> {
    match member {
        Some((rank, group)) => group.exchange(rank, values, read),
        None => {
            read(&[values.to_vec()]);
            Ok(())
        }
    }
}

const ABORTED: &str = "another rank of the in-process group failed";

/// The error a rank waiting on an aborted group or mailbox gets.
pub(super) fn aborted() -> ExecError {
    ExecError::Device(ABORTED.into())
}

/// Whether `e` is only the error a rank gets when another rank's failure aborted the group.
pub fn is_abort(e: &ExecError) -> bool {
    matches!(e, ExecError::Device(m) if m == ABORTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_reads_every_slot_in_rank_order() {
        let group = Group::new(3);
        let seen: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|r| {
                    let group = &group;
                    s.spawn(move || {
                        let mut got = Vec::new();
                        for round in 0..2 {
                            let v = [r as f32 + 10.0 * round as f32];
                            let read = |all: &[Vec<f32>]| got.extend(all.iter().map(|s| s[0]));
                            group.exchange(r, &v, read).expect("exchange");
                        }
                        got
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        assert_eq!(seen.len(), 3);
        for got in seen {
            assert_eq!(got, vec![0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
        }
    }

    #[test]
    fn an_aborted_group_releases_the_waiting_rank() {
        let group = Group::new(2);
        let result = std::thread::scope(|s| {
            let waiting = s.spawn(|| group.exchange(0, &[1.0], |_| {}));
            std::thread::sleep(std::time::Duration::from_millis(20));
            group.abort();
            waiting.join()
        });
        let released = result.expect("the waiting rank's thread");
        assert!(released.as_ref().is_err_and(is_abort), "{released:?}");
    }
}

//! The in-process point-to-point channel of the CPU backend between the pipeline stages of
//! one replica (of one tensor rank of it, each tensor rank with its own): a send leaves its values under its key and returns at once; a receive waits
//! until the values under its key are there and takes them. A key names the sending and
//! the receiving stage and the [`PipeLink`], so messages meet whatever order the stages'
//! plans send them in. A rank that fails aborts the mailbox, releasing every waiting
//! receive with an error.

use super::group::aborted;
use super::ExecError;
use crate::ir::PipeLink;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

/// Who sent a message to whom, and what it is.
type Key = (u32, u32, PipeLink);

/// The messages in flight between one replica's (tensor rank's) stages; shared by their
/// executors.
#[derive(Debug, Default)]
pub struct Mailbox {
    state: Mutex<State>,
    posted: Condvar,
}

#[derive(Debug, Default)]
struct State {
    messages: HashMap<Key, Vec<f32>>,
    aborted: bool,
}

fn poisoned<T>(_: T) -> ExecError {
    ExecError::Device("a stage of the in-process pipeline panicked".into())
}

impl Mailbox {
    /// An empty mailbox.
    pub fn new() -> Mailbox {
        Mailbox::default()
    }

    /// Makes every receive waiting (now or later) return an error: a rank failed.
    pub fn abort(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.aborted = true;
        }
        self.posted.notify_all();
    }

    /// Leaves `values` from stage `from` for stage `link.peer`; a second message under the
    /// same key before the first is taken is an error (each link is sent once a step).
    pub fn send(&self, from: u32, link: PipeLink, values: &[f32]) -> Result<(), ExecError> {
        let key = (from, link.peer, PipeLink { peer: 0, ..link });
        let mut s = self.state.lock().map_err(poisoned)?;
        if s.messages.insert(key, values.to_vec()).is_some() {
            return Err(ExecError::Device(format!(
                "stage {from} sent micro-batch {} of value {} to stage {} twice",
                link.micro, link.value, link.peer
            )));
        }
        self.posted.notify_all();
        Ok(())
    }

    /// Waits for the message stage `link.peer` sends stage `to` under `link`, and writes it
    /// into `dst` (whose length it must have).
    pub fn recv(&self, to: u32, link: PipeLink, dst: &mut [f32]) -> Result<(), ExecError> {
        let key = (link.peer, to, PipeLink { peer: 0, ..link });
        let mut s = self.state.lock().map_err(poisoned)?;
        loop {
            if s.aborted {
                return Err(aborted());
            }
            if let Some(values) = s.messages.remove(&key) {
                if values.len() != dst.len() {
                    return Err(ExecError::Device(format!(
                        "stage {to} expected {} elements of value {} from stage {}, got {}",
                        dst.len(),
                        link.value,
                        link.peer,
                        values.len()
                    )));
                }
                dst.copy_from_slice(&values);
                return Ok(());
            }
            s = self.posted.wait(s).map_err(poisoned)?;
        }
    }
}

impl super::cpu::CpuStep<'_> {
    /// This stage's send of `values` under `link` through its replica's mailbox; a plan
    /// without a pipeline has no sends.
    pub fn pipeline_send(&self, link: PipeLink, values: &[f32]) -> Result<(), ExecError> {
        let (stage, mailbox) = self.stage()?;
        mailbox.send(stage, link, values)
    }

    /// This stage's receive under `link` into `dst`, waiting for the peer's send.
    pub fn pipeline_recv(&self, link: PipeLink, dst: &mut [f32]) -> Result<(), ExecError> {
        let (stage, mailbox) = self.stage()?;
        mailbox.recv(stage, link, dst)
    }

    fn stage(&self) -> Result<(u32, &Mailbox), ExecError> {
        self.pipeline_member().ok_or_else(|| {
            ExecError::Unsupported(
                "a pipeline send or receive, run by one rank alone: run the plan's stages \
                 together (`memc run --parallel`, `exec::ranks::Ranks`)"
                    .into(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(peer: u32, micro: u32) -> PipeLink {
        PipeLink {
            peer,
            micro,
            value: 7,
            gradient: false,
        }
    }

    #[test]
    fn a_receive_takes_the_matching_send_in_any_order() {
        let mailbox = Mailbox::new();
        let got = std::thread::scope(|s| {
            let receiver = s.spawn(|| {
                let (mut second, mut first) = ([0.0; 2], [0.0; 2]);
                mailbox.recv(1, link(0, 1), &mut second)?;
                mailbox.recv(1, link(0, 0), &mut first)?;
                Ok::<_, ExecError>((first, second))
            });
            mailbox.send(0, link(1, 0), &[1.0, 2.0]).expect("send 0");
            mailbox.send(0, link(1, 1), &[3.0, 4.0]).expect("send 1");
            receiver.join().expect("receiver thread")
        });
        assert_eq!(got.expect("received"), ([1.0, 2.0], [3.0, 4.0]));
    }

    #[test]
    fn an_aborted_mailbox_releases_the_waiting_receive() {
        let mailbox = Mailbox::new();
        let result = std::thread::scope(|s| {
            let waiting = s.spawn(|| mailbox.recv(1, link(0, 0), &mut [0.0]));
            std::thread::sleep(std::time::Duration::from_millis(20));
            mailbox.abort();
            waiting.join().expect("receiver thread")
        });
        assert!(
            result.as_ref().is_err_and(super::super::group::is_abort),
            "{result:?}"
        );
    }
}

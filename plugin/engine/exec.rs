//! The one action executor: carries out an engine's [`Action`]s, in order, on whatever
//! implements [`ActionSink`]: the comm (`crate::comm`: a transport QP and registered memory)
//! or the simulated pair ([`super::sim`]: fake memory and queues). Both use an [`Executor`], so
//! the order in which stages, posts and copies happen (and which sends share a post call)
//! is decided once, here, and the simulator cannot drift from the driver.

use super::{Action, ReqId};
use crate::transport::{RecvWr, SendWr};

/// What carries out the engine's actions. Each method does one thing and reports its failure;
/// [`Executor::execute`] decides the order and the batching.
pub trait ActionSink {
    /// A failure to carry out an action.
    type Error;

    /// Writes `bytes` at plugin-owned address `addr` (a staging buffer).
    fn stage(&mut self, addr: u64, bytes: &[u8]) -> Result<(), Self::Error>;

    /// Posts send WRs, in order, in one post call, on QP `qp` of the connection (0: the first
    /// QP, which every engine uses; above: data QPs, see [`Action::PostSendQp`]).
    fn post_send(&mut self, qp: usize, wrs: &[SendWr]) -> Result<(), Self::Error>;

    /// Posts receive WRs, in order, in one post call, on QP `qp` of the connection (0: QP 0's
    /// receive queue; above: a data QP's, see [`Action::PostRecvQp`]).
    fn post_recv(&mut self, qp: usize, wrs: &[RecvWr]) -> Result<(), Self::Error>;

    /// Copies `len` bytes from the bounce buffer at `src` into buffer `buf` of receive request
    /// `req`, at offset 0 (an eager message delivered).
    fn copy(&mut self, src: u64, req: ReqId, buf: usize, len: u64) -> Result<(), Self::Error>;

    /// Gives bounce buffers (addr, lkey) the receive queue no longer uses back to the pool.
    fn return_bounce(&mut self, bufs: &[(u64, u32)]) -> Result<(), Self::Error>;
}

/// An engine's queue of actions, as the [`Executor`] takes it.
pub trait ActionQueue {
    /// Moves the actions produced so far into `out` (empty), in order; with an empty `out`
    /// this is a swap of the two buffers, so neither allocates once both are warm.
    fn take_actions(&mut self, out: &mut Vec<Action>);

    /// Takes back the receive-WR lists of the [`Action::PostRecv`]s and
    /// [`Action::PostRecvQp`]s just carried out, emptied (`spent`, left empty), so that the
    /// next posts reuse their capacity instead of allocating. The default drops them.
    fn recycle_recv_lists(&mut self, spent: &mut Vec<Vec<RecvWr>>) {
        spent.clear();
    }
}

/// The one action executor: carries out an engine's actions in order on an [`ActionSink`].
/// It keeps its buffers between calls (the actions it takes, trading buffers with the engine,
/// and the batch of send WRs it collects), so that once warm it allocates nothing; a comm and
/// the simulated pair each keep one.
#[derive(Debug, Default)]
pub struct Executor {
    actions: Vec<Action>,
    sends: Vec<SendWr>,
    /// The QP the WRs in `sends` go to.
    sends_qp: usize,
    /// The emptied receive-WR lists of the last call, handed back to the engine.
    spent: Vec<Vec<RecvWr>>,
    sq_post_calls: u64,
    sq_wrs_posted: u64,
}

impl Executor {
    /// Send-side post calls made so far (`ibv_post_send` calls: counter `sq_post_calls`).
    pub fn sq_post_calls(&self) -> u64 {
        self.sq_post_calls
    }

    /// Send WRs posted so far, of every kind (counter `sq_wrs_posted`).
    pub fn sq_wrs_posted(&self) -> u64 {
        self.sq_wrs_posted
    }

    /// Carries out the actions `engine` produced so far, in order, on `sink`, stopping at the
    /// first failure (the actions after it are dropped: the caller fails the engine with the
    /// error).
    ///
    /// Consecutive [`Action::PostSend`]s (or [`Action::PostSendQp`]s to one QP) go out in one
    /// [`ActionSink::post_send`] (one doorbell, or one socket write, for a CTS and its credit
    /// write), flushed before the next [`Action::PostRecv`], before a send to another QP and
    /// at the end (a receive post on a data QP, [`Action::PostRecvQp`], flushes likewise).
    /// Stages and copies do not flush: the engine stages
    /// into a slot no WR queued before it reads, so writing it early is the same as writing it
    /// in place.
    ///
    /// # Errors
    /// The first error a sink method returned.
    #[inline]
    pub fn execute<S: ActionSink + ?Sized>(
        &mut self,
        engine: &mut (impl ActionQueue + ?Sized),
        sink: &mut S,
    ) -> Result<(), S::Error> {
        engine.take_actions(&mut self.actions);
        if self.actions.is_empty() {
            return Ok(());
        }
        // Carried out where they lie (an action is not moved out to be matched), then
        // dropped; the emptied buffer (its capacity) goes to the engine at the next call.
        let mut actions = std::mem::take(&mut self.actions);
        let r = self.run(actions.iter_mut(), sink);
        actions.clear();
        self.actions = actions;
        if !self.spent.is_empty() {
            engine.recycle_recv_lists(&mut self.spent);
        }
        r
    }

    #[inline]
    fn run<'a, S: ActionSink + ?Sized>(
        &mut self,
        actions: impl Iterator<Item = &'a mut Action>,
        sink: &mut S,
    ) -> Result<(), S::Error> {
        self.sends.clear();
        self.sends_qp = 0;
        for a in actions {
            match a {
                Action::Stage { addr, bytes } => sink.stage(*addr, bytes)?,
                Action::PostSend(wr) => self.queue_send(0, *wr, sink)?,
                Action::PostSendQp { qp, wr } => self.queue_send(usize::from(*qp), *wr, sink)?,
                Action::PostRecv(wrs) => {
                    self.flush(sink)?;
                    sink.post_recv(0, wrs)?;
                    self.spend(std::mem::take(wrs));
                }
                Action::PostRecvQp { qp, wrs } => {
                    self.flush(sink)?;
                    sink.post_recv(usize::from(*qp), wrs)?;
                    self.spend(std::mem::take(wrs));
                }
                Action::Copy { src, req, buf, len } => sink.copy(*src, *req, *buf, *len)?,
                Action::ReturnBounce(bufs) => sink.return_bounce(bufs)?,
            }
        }
        self.flush(sink)
    }

    /// Keeps a posted receive-WR list, emptied, for the engine to reuse.
    fn spend(&mut self, mut wrs: Vec<RecvWr>) {
        wrs.clear();
        self.spent.push(wrs);
    }

    #[inline]
    fn queue_send<S: ActionSink + ?Sized>(
        &mut self,
        qp: usize,
        wr: SendWr,
        sink: &mut S,
    ) -> Result<(), S::Error> {
        if qp != self.sends_qp {
            self.flush(sink)?;
            self.sends_qp = qp;
        }
        self.sends.push(wr);
        Ok(())
    }

    #[inline]
    fn flush<S: ActionSink + ?Sized>(&mut self, sink: &mut S) -> Result<(), S::Error> {
        if self.sends.is_empty() {
            return Ok(());
        }
        let r = sink.post_send(self.sends_qp, &self.sends);
        self.sq_post_calls += 1;
        self.sq_wrs_posted += self.sends.len() as u64;
        self.sends.clear();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StageBytes;
    use crate::transport::{SendOpcode, Sge};

    /// Records every call, failing the `fail_at`-th one.
    #[derive(Default)]
    struct Log {
        calls: Vec<String>,
        fail_at: Option<usize>,
    }

    impl Log {
        fn call(&mut self, what: String) -> Result<(), String> {
            self.calls.push(what.clone());
            match self.fail_at {
                Some(n) if n + 1 == self.calls.len() => Err(what),
                _ => Ok(()),
            }
        }
    }

    impl ActionSink for Log {
        type Error = String;
        fn stage(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String> {
            self.call(format!("stage {addr:#x} {}", bytes.len()))
        }
        fn post_send(&mut self, qp: usize, wrs: &[SendWr]) -> Result<(), String> {
            let ids: Vec<u64> = wrs.iter().map(|w| w.wr_id).collect();
            if qp == 0 {
                self.call(format!("send {ids:?}"))
            } else {
                self.call(format!("send qp{qp} {ids:?}"))
            }
        }
        fn post_recv(&mut self, qp: usize, wrs: &[RecvWr]) -> Result<(), String> {
            let ids: Vec<u64> = wrs.iter().map(|w| w.wr_id).collect();
            if qp == 0 {
                self.call(format!("recv {ids:?}"))
            } else {
                self.call(format!("recv qp{qp} {ids:?}"))
            }
        }
        fn copy(&mut self, src: u64, req: ReqId, buf: usize, len: u64) -> Result<(), String> {
            self.call(format!("copy {src:#x} {} {buf} {len}", req.slot))
        }
        fn return_bounce(&mut self, bufs: &[(u64, u32)]) -> Result<(), String> {
            self.call(format!("return {}", bufs.len()))
        }
    }

    fn send(id: u64) -> Action {
        Action::PostSend(SendWr {
            wr_id: id,
            sgl: [Sge::default(); 2],
            num_sge: 0,
            opcode: SendOpcode::Send,
            signaled: true,
            inline: false,
        })
    }

    fn recv(id: u64) -> Action {
        Action::PostRecv(vec![RecvWr {
            wr_id: id,
            sge: Sge::default(),
        }])
    }

    impl ActionQueue for Vec<Action> {
        fn take_actions(&mut self, out: &mut Vec<Action>) {
            out.append(self);
        }
    }

    fn actions() -> Vec<Action> {
        vec![
            Action::Stage {
                addr: 0x10,
                bytes: StageBytes::from(&[1u8; 8][..]),
            },
            send(1),
            Action::Stage {
                addr: 0x20,
                bytes: StageBytes::from(&[2u8; 8][..]),
            },
            send(2),
            recv(3),
            Action::Copy {
                src: 0x30,
                req: ReqId { slot: 4, gen: 0 },
                buf: 1,
                len: 5,
            },
            send(5),
            Action::ReturnBounce(vec![(0x40, 1), (0x50, 1)]),
        ]
    }

    #[test]
    fn consecutive_sends_share_a_post_flushed_before_a_receive_post_and_at_the_end() {
        let mut log = Log::default();
        assert_eq!(
            Executor::default().execute(&mut actions(), &mut log),
            Ok(())
        );
        assert_eq!(
            log.calls,
            [
                "stage 0x10 8",
                "stage 0x20 8",
                "send [1, 2]",
                "recv [3]",
                "copy 0x30 4 1 5",
                "return 2",
                "send [5]",
            ]
        );
    }

    #[test]
    fn sends_to_another_qp_and_data_qp_receive_posts_flush_the_batch() {
        let on = |qp: u8, id: u64| match send(id) {
            Action::PostSend(wr) => Action::PostSendQp { qp, wr },
            _ => unreachable!(),
        };
        let recv_on = |qp: u8, id: u64| Action::PostRecvQp {
            qp,
            wrs: vec![RecvWr {
                wr_id: id,
                sge: Sge::default(),
            }],
        };
        let mut q = vec![
            send(1),
            on(2, 2),
            on(2, 3),
            on(1, 4),
            send(5),
            recv_on(3, 7),
            send(6),
            send(8),
        ];
        let mut log = Log::default();
        assert_eq!(Executor::default().execute(&mut q, &mut log), Ok(()));
        assert_eq!(
            log.calls,
            [
                "send [1]",
                "send qp2 [2, 3]",
                "send qp1 [4]",
                "send [5]",
                "recv qp3 [7]",
                "send [6, 8]"
            ]
        );
    }

    #[test]
    fn the_first_failure_stops_the_rest() {
        let mut log = Log {
            fail_at: Some(2),
            ..Log::default()
        };
        assert_eq!(
            Executor::default().execute(&mut actions(), &mut log),
            Err("send [1, 2]".into())
        );
        assert_eq!(log.calls.len(), 3, "nothing after the failed post");
        let mut log = Log {
            fail_at: Some(0),
            ..Log::default()
        };
        assert_eq!(
            Executor::default().execute(&mut actions(), &mut log),
            Err("stage 0x10 8".into())
        );
        assert_eq!(
            log.calls,
            ["stage 0x10 8"],
            "the queued sends are not posted"
        );
    }
}

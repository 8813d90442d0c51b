//! Collectives as ring schedules ("plans"): what one rank sends to its ring successor and
//! receives from its predecessor, in order, cut into pieces of at most one proxy slot. Both
//! neighbours derive their plans from the same sizes, so rank r's sends match rank r+1's
//! receives piece for piece.

/// Where a send takes its bytes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// The read-only input buffer.
    Input,
    /// The work buffer (results of earlier receives).
    Work,
}

/// One piece sent to the successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOp {
    /// Source buffer.
    pub src: Src,
    /// Byte offset in it.
    pub off: usize,
    /// Bytes (1..=slot size).
    pub len: usize,
    /// Index of the receive that must have completed first (the data it forwards).
    pub after: Option<usize>,
}

/// One piece received from the predecessor into the work buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvOp {
    /// Byte offset in the work buffer.
    pub off: usize,
    /// Bytes.
    pub len: usize,
    /// Reduce into the work buffer (else overwrite).
    pub reduce: bool,
}

/// One rank's schedule for one collective call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Sends, in posting order.
    pub sends: Vec<SendOp>,
    /// Receives, in posting order.
    pub recvs: Vec<RecvOp>,
}

/// `[start, end)` in elements of segment `j` when `count` elements are split into `n` parts.
pub fn segment(count: usize, n: usize, j: usize) -> (usize, usize) {
    (j * count / n, (j + 1) * count / n)
}

/// Cuts `[off, off+len)` into pieces of at most `chunk` bytes.
pub(crate) fn pieces(off: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(chunk)).map(move |i| {
        let o = i * chunk;
        (off + o, chunk.min(len - o))
    })
}

/// Builder for ring plans: each step sends one byte range and receives another; a step's sends
/// may depend on the previous step's receives piece by piece.
struct RingSteps {
    plan: Plan,
    chunk: usize,
    /// Receive op indices of the previous step.
    prev_recvs: Vec<usize>,
}

impl RingSteps {
    /// Pieces are whole elements: `chunk` is rounded down to a multiple of `es` (at least one).
    fn new(chunk: usize, es: usize) -> RingSteps {
        RingSteps {
            plan: Plan::default(),
            chunk: (chunk - chunk % es).max(es),
            prev_recvs: Vec::new(),
        }
    }

    /// Adds one step. `forward`: the sent range is the range received in the previous step,
    /// so each send piece waits for the matching receive piece.
    fn step(
        &mut self,
        src: Src,
        send: (usize, usize),
        recv: (usize, usize),
        reduce: bool,
        forward: bool,
    ) {
        for (i, (off, len)) in pieces(send.0, send.1, self.chunk).enumerate() {
            let after = if forward {
                Some(self.prev_recvs[i])
            } else {
                None
            };
            self.plan.sends.push(SendOp {
                src,
                off,
                len,
                after,
            });
        }
        self.prev_recvs.clear();
        for (off, len) in pieces(recv.0, recv.1, self.chunk) {
            self.prev_recvs.push(self.plan.recvs.len());
            self.plan.recvs.push(RecvOp { off, len, reduce });
        }
    }
}

fn modn(x: isize, n: usize) -> usize {
    x.rem_euclid(n as isize) as usize
}

/// Byte range of segment `j` (elements split over `n`, element size `es`).
fn seg_bytes(count: usize, n: usize, j: usize, es: usize) -> (usize, usize) {
    let (a, b) = segment(count, n, j);
    (a * es, (b - a) * es)
}

/// Ring all-reduce of `count` elements in the work buffer: reduce-scatter (n-1 steps, rank r
/// ends owning segment r+1), then all-gather (n-1 steps), as NCCL's ring does.
pub fn all_reduce_plan(count: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    for k in 0..n.saturating_sub(1) as isize {
        let send = seg_bytes(count, n, modn(r - k, n), es);
        let recv = seg_bytes(count, n, modn(r - k - 1, n), es);
        b.step(Src::Work, send, recv, true, k > 0);
    }
    for k in 0..n.saturating_sub(1) as isize {
        let send = seg_bytes(count, n, modn(r + 1 - k, n), es);
        let recv = seg_bytes(count, n, modn(r - k, n), es);
        b.step(Src::Work, send, recv, false, true);
    }
    b.plan
}

/// Ring all-gather: the work buffer holds `n` blocks of `per` elements, this rank's own block
/// already in place; n-1 steps forward the block received last.
pub fn all_gather_plan(per: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    let block = |j: usize| (j * per * es, per * es);
    for k in 0..n.saturating_sub(1) as isize {
        b.step(
            Src::Work,
            block(modn(r - k, n)),
            block(modn(r - k - 1, n)),
            false,
            k > 0,
        );
    }
    b.plan
}

/// Ring reduce-scatter: the work buffer holds this rank's `n` input blocks of `per` elements;
/// after n-1 steps block `rank` holds the reduction over all ranks.
pub fn reduce_scatter_plan(per: usize, es: usize, rank: usize, n: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, es);
    let r = rank as isize;
    let block = |j: usize| (j * per * es, per * es);
    for k in 0..n.saturating_sub(1) as isize {
        b.step(
            Src::Work,
            block(modn(r - k - 1, n)),
            block(modn(r - k - 2, n)),
            true,
            k > 0,
        );
    }
    b.plan
}

/// Send all `bytes` of the input to the successor, receive as many from the predecessor.
pub fn sendrecv_plan(bytes: usize, chunk: usize) -> Plan {
    let mut b = RingSteps::new(chunk, 1);
    b.step(Src::Input, (0, bytes), (0, bytes), false, false);
    b.plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{count_wrong, reduce_into, DataType, Expected, Pattern, RedOp};

    /// Runs the plans of all ranks against each other in memory (each rank's sends are its
    /// successor's receives, in order), honouring the send dependencies, and returns the work
    /// buffers. This checks the schedules, not the plugin.
    fn simulate(
        plans: &[Plan],
        inputs: &[Vec<u8>],
        mut works: Vec<Vec<u8>>,
        dtype: DataType,
        op: RedOp,
    ) -> Vec<Vec<u8>> {
        let n = plans.len();
        // Next send index per rank, next recv index per rank.
        let mut ns = vec![0; n];
        let mut nr = vec![0; n];
        loop {
            let mut moved = false;
            for r in 0..n {
                let next = (r + 1) % n;
                while ns[r] < plans[r].sends.len() {
                    let s = plans[r].sends[ns[r]];
                    if s.after.is_some_and(|i| i >= nr[r]) {
                        break;
                    }
                    let src = match s.src {
                        Src::Input => inputs[r][s.off..s.off + s.len].to_vec(),
                        Src::Work => works[r][s.off..s.off + s.len].to_vec(),
                    };
                    let rv = plans[next].recvs[nr[next]];
                    assert_eq!(
                        rv.len, s.len,
                        "send {} of rank {r} vs recv of {next}",
                        ns[r]
                    );
                    let dst = &mut works[next][rv.off..rv.off + rv.len];
                    if rv.reduce {
                        reduce_into(dtype, op, dst, &src);
                    } else {
                        dst.copy_from_slice(&src);
                    }
                    ns[r] += 1;
                    nr[next] += 1;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        for r in 0..n {
            assert_eq!(ns[r], plans[r].sends.len(), "rank {r} stuck");
            assert_eq!(nr[r], plans[r].recvs.len(), "rank {r} stuck");
        }
        works
    }

    fn filled(p: &Pattern, rank: usize, elems: usize, first: usize) -> Vec<u8> {
        let mut b = vec![0u8; elems * p.dtype.size()];
        p.fill(&mut b, rank, first);
        b
    }

    #[test]
    fn segments_cover_everything() {
        for count in [0, 1, 5, 7, 100] {
            for n in 1..6 {
                let mut end = 0;
                for j in 0..n {
                    let (a, b) = segment(count, n, j);
                    assert_eq!(a, end);
                    end = b;
                }
                assert_eq!(end, count);
            }
        }
        let p: Vec<_> = pieces(10, 25, 10).collect();
        assert_eq!(p, vec![(10, 10), (20, 10), (30, 5)]);
        assert_eq!(pieces(0, 0, 10).count(), 0);
    }

    #[test]
    fn all_reduce_plans_compute_the_reduction() {
        for (n, count, chunk) in [
            (1, 10, 8),
            (2, 11, 8),
            (3, 100, 12),
            (4, 1000, 64),
            (5, 3, 4),
        ] {
            for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max] {
                let dtype = DataType::Float;
                let p = Pattern { dtype, op, seed: 9 };
                let plans: Vec<_> = (0..n)
                    .map(|r| all_reduce_plan(count, 4, r, n, chunk))
                    .collect();
                let works = (0..n).map(|r| filled(&p, r, count, 0)).collect();
                let out = simulate(&plans, &vec![vec![]; n], works, dtype, op);
                for (r, w) in out.iter().enumerate() {
                    let wrong = count_wrong(dtype, w, |i| Expected::Reduced {
                        pattern: p,
                        nranks: n,
                        index: i,
                    });
                    assert_eq!(wrong, 0, "n={n} count={count} op={op} rank {r}");
                }
            }
        }
    }

    #[test]
    fn all_gather_plans_collect_every_block() {
        for (n, per, chunk) in [(1, 4, 8), (2, 5, 8), (3, 33, 16), (4, 0, 8)] {
            let dtype = DataType::Int32;
            let p = Pattern {
                dtype,
                op: RedOp::Sum,
                seed: 1,
            };
            let plans: Vec<_> = (0..n)
                .map(|r| all_gather_plan(per, 4, r, n, chunk))
                .collect();
            let works = (0..n)
                .map(|r| {
                    let mut w = vec![0xEEu8; n * per * 4];
                    p.fill(&mut w[r * per * 4..(r + 1) * per * 4], r, 0);
                    w
                })
                .collect();
            let out = simulate(&plans, &vec![vec![]; n], works, dtype, RedOp::Sum);
            for w in &out {
                let wrong = count_wrong(dtype, w, |i| Expected::Input {
                    pattern: p,
                    rank: i / per,
                    index: i % per,
                });
                assert_eq!(wrong, 0, "n={n} per={per}");
            }
        }
    }

    #[test]
    fn reduce_scatter_plans_leave_each_rank_its_block() {
        for (n, per, chunk) in [(1, 4, 8), (2, 5, 8), (3, 33, 16), (4, 17, 24)] {
            let dtype = DataType::Float64;
            let p = Pattern {
                dtype,
                op: RedOp::Sum,
                seed: 2,
            };
            let plans: Vec<_> = (0..n)
                .map(|r| reduce_scatter_plan(per, 8, r, n, chunk))
                .collect();
            let works = (0..n).map(|r| filled(&p, r, n * per, 0)).collect();
            let out = simulate(&plans, &vec![vec![]; n], works, dtype, RedOp::Sum);
            for (r, w) in out.iter().enumerate() {
                let mine = &w[r * per * 8..(r + 1) * per * 8];
                let wrong = count_wrong(dtype, mine, |i| Expected::Reduced {
                    pattern: p,
                    nranks: n,
                    index: r * per + i,
                });
                assert_eq!(wrong, 0, "n={n} per={per} rank {r}");
            }
        }
    }

    #[test]
    fn sendrecv_plans_shift_by_one() {
        let n = 3;
        let dtype = DataType::Float;
        let p = Pattern {
            dtype,
            op: RedOp::Sum,
            seed: 5,
        };
        let plans: Vec<_> = (0..n).map(|_| sendrecv_plan(40, 16)).collect();
        let inputs: Vec<_> = (0..n).map(|r| filled(&p, r, 10, 0)).collect();
        let out = simulate(&plans, &inputs, vec![vec![0; 40]; n], dtype, RedOp::Sum);
        for (r, w) in out.iter().enumerate() {
            assert_eq!(w, &inputs[(r + n - 1) % n]);
        }
    }

    #[test]
    fn forwarded_sends_wait_for_their_receive() {
        let plan = all_reduce_plan(64, 4, 0, 4, 8);
        for s in &plan.sends {
            if let Some(i) = s.after {
                let rv = plan.recvs[i];
                assert_eq!((rv.off, rv.len), (s.off, s.len));
            }
        }
        // 2(n-1) = 6 steps of one 64-byte segment (16 elements) in 8 pieces of 8 bytes.
        assert_eq!(plan.sends.len(), 48);
        assert_eq!(plan.recvs.len(), 48);
        assert_eq!(plan.sends.iter().filter(|s| s.after.is_none()).count(), 8);
    }
}

//! What one rank runs and checks for one size: the buffer shapes ([`Layout`]), the plan, the
//! connections and the collective call with its data check.

use std::time::Instant;

use crate::bootstrap::Bootstrap;
use crate::cli::{Args, Collective, Proxy};
use crate::coll::{self, Plan, Ring};
use crate::cputime::{self, CpuUse};
use crate::data::{count_wrong, DataType, Expected, Pattern, RedOp};
use crate::mesh::Mesh;
use crate::report::Measure;

use super::Result;

/// Byte value of untouched output (never a valid result; see [`Layout`]).
const SENTINEL: u8 = 0x7F;

/// Buffer shapes of one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Size column: bytes (total over ranks for all-gather / reduce-scatter).
    pub size: u64,
    /// Count column: size / element size.
    pub count: u64,
    /// Elements per rank block (all-gather / reduce-scatter), or the whole count.
    pub per: usize,
    /// Input elements per rank.
    pub in_elems: usize,
    /// Output elements per rank.
    pub out_elems: usize,
}

impl Layout {
    /// The shapes nccl-tests uses for `bytes` requested: all-reduce and sendrecv move
    /// `bytes / es` elements; all-gather and reduce-scatter split the total over ranks.
    pub fn new(coll: Collective, bytes: u64, dtype: DataType, nranks: usize) -> Layout {
        let es = dtype.size();
        let elems = (bytes / es as u64) as usize;
        let (per, in_elems, out_elems, total) = match coll {
            // The point-to-point modes move whole messages of `bytes`; they run in `crate::p2p`.
            Collective::AllReduce
            | Collective::Sendrecv
            | Collective::Stream
            | Collective::Latency => (elems, elems, elems, elems),
            Collective::AllGather => {
                let per = elems / nranks;
                (per, per, per * nranks, per * nranks)
            }
            Collective::Alltoall => {
                let per = elems / nranks;
                (per, per * nranks, per * nranks, per * nranks)
            }
            Collective::ReduceScatter => {
                let per = elems / nranks;
                (per, per * nranks, per, per * nranks)
            }
        };
        Layout {
            size: (total * es) as u64,
            count: total as u64,
            per,
            in_elems,
            out_elems,
        }
    }

    /// Bytes of the single buffer of an in-place call.
    fn inplace_elems(&self) -> usize {
        self.in_elems.max(self.out_elems)
    }
}

/// The plan of `coll` at `rank` for `layout`.
pub fn plan_for(
    coll: Collective,
    l: &Layout,
    dtype: DataType,
    rank: usize,
    n: usize,
    chunk: usize,
) -> Plan {
    let es = dtype.size();
    match coll {
        Collective::AllReduce => coll::all_reduce_plan(l.in_elems, es, rank, n, chunk),
        Collective::AllGather => coll::all_gather_plan(l.per, es, rank, n, chunk),
        Collective::ReduceScatter => coll::reduce_scatter_plan(l.per, es, rank, n, chunk),
        Collective::Sendrecv => coll::sendrecv_plan(l.in_elems * es, chunk),
        // The mesh derives its pieces from the block size itself; the point-to-point modes
        // (`crate::p2p`) have no plan.
        Collective::Alltoall | Collective::Stream | Collective::Latency => Plan::default(),
    }
}

/// The plugin connections of a run: a ring for the ring collectives, a full mesh for alltoall.
pub(super) enum Conns<'n> {
    Ring(Box<Ring<'n>>),
    Mesh(Mesh<'n>),
}

impl<'n> Conns<'n> {
    fn ring(&mut self) -> Result<&mut Ring<'n>> {
        match self {
            Conns::Ring(r) => Ok(r),
            Conns::Mesh(_) => Err("a ring collective on alltoall's mesh".into()),
        }
    }

    pub(super) fn close(self) -> Result<()> {
        match self {
            Conns::Ring(r) => (*r).close(),
            Conns::Mesh(m) => m.close(),
        }
    }

    /// Announces `calls` more calls of `plan` ([`Ring::expect_recvs`]), so the ring posts
    /// receives ahead across them as NCCL's proxy does for operations launched ahead.
    fn expect(&mut self, plan: &crate::coll::Plan, calls: u32) {
        if let Conns::Ring(r) = self {
            r.expect_recvs(plan.recvs.len() * calls as usize);
        }
    }

    /// Waits for the ring's sends still in flight ([`Ring::drain`]); the mesh leaves none.
    fn drain(&mut self) -> Result<()> {
        match self {
            Conns::Ring(r) => r.drain(),
            Conns::Mesh(_) => Ok(()),
        }
    }
}

/// The buffers of one placement (out-of-place or in-place) of one size.
struct Buffers {
    inplace: bool,
    /// Out-of-place input (empty in place).
    input: Vec<u8>,
    /// Out-of-place output, or the single in-place buffer.
    output: Vec<u8>,
    /// Reduce-scatter work copy; in-place sendrecv staging copy.
    scratch: Vec<u8>,
}

/// What one rank needs to run and check a collective.
pub(super) struct Job<'a> {
    pub(super) coll: Collective,
    pub(super) proxy: Proxy,
    pub(super) dtype: DataType,
    pub(super) op: RedOp,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    pub(super) layout: Layout,
    pub(super) plan: &'a Plan,
}

impl Job<'_> {
    fn es(&self) -> usize {
        self.dtype.size()
    }

    /// Byte range of this rank's block.
    fn my_block(&self) -> std::ops::Range<usize> {
        let b = self.layout.per * self.es();
        self.rank * b..(self.rank + 1) * b
    }

    fn buffers(&self, inplace: bool) -> Buffers {
        let es = self.es();
        let l = &self.layout;
        let scratch = match (self.coll, inplace) {
            (Collective::ReduceScatter, _) => l.in_elems * es,
            (Collective::Sendrecv | Collective::Alltoall, true) => l.in_elems * es,
            _ => 0,
        };
        Buffers {
            inplace,
            input: if inplace {
                Vec::new()
            } else {
                vec![0; l.in_elems * es]
            },
            output: vec![
                SENTINEL;
                if inplace {
                    l.inplace_elems() * es
                } else {
                    l.out_elems * es
                }
            ],
            scratch: vec![0; scratch],
        }
    }

    fn pattern(&self, seed: u64) -> Pattern {
        Pattern {
            dtype: self.dtype,
            op: self.op,
            seed,
        }
    }

    /// Writes this rank's input for `seed` and marks the output as untouched.
    fn init(&self, b: &mut Buffers, seed: u64) {
        let p = self.pattern(seed);
        b.output.fill(SENTINEL);
        if !b.inplace {
            p.fill(&mut b.input, self.rank, 0);
        } else if self.coll == Collective::AllGather {
            let block = self.my_block();
            p.fill(&mut b.output[block], self.rank, 0);
        } else {
            p.fill(&mut b.output, self.rank, 0);
        }
    }

    /// One collective call (including the local copies NCCL's kernels would do).
    fn call(&self, conns: &mut Conns<'_>, b: &mut Buffers) -> Result<()> {
        let (dtype, op) = (self.dtype, self.op);
        let Buffers {
            inplace,
            input,
            output,
            scratch,
        } = b;
        if let Conns::Mesh(mesh) = conns {
            let block = self.layout.per * self.es();
            return if *inplace {
                scratch.copy_from_slice(output);
                mesh.alltoall(scratch, output, block, self.es(), self.proxy)
            } else {
                mesh.alltoall(input, output, block, self.es(), self.proxy)
            };
        }
        let ring = conns.ring()?;
        match (self.coll, *inplace) {
            (Collective::AllReduce, false) => {
                output.copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::AllReduce | Collective::AllGather, true) => {
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::AllGather, false) => {
                output[self.my_block()].copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], output, dtype, op)
            }
            (Collective::ReduceScatter, false) => {
                scratch.copy_from_slice(input);
                ring.run(self.proxy, self.plan, &[], scratch, dtype, op)?;
                output.copy_from_slice(&scratch[self.my_block()]);
                Ok(())
            }
            (Collective::ReduceScatter, true) => {
                scratch.copy_from_slice(output);
                ring.run(self.proxy, self.plan, &[], scratch, dtype, op)?;
                let block = self.my_block();
                output[block.clone()].copy_from_slice(&scratch[block]);
                Ok(())
            }
            (Collective::Sendrecv, false) => {
                ring.run(self.proxy, self.plan, input, output, dtype, op)
            }
            (Collective::Sendrecv, true) => {
                scratch.copy_from_slice(output);
                ring.run(self.proxy, self.plan, scratch, output, dtype, op)
            }
            (Collective::Alltoall, _) => Err("alltoall needs the mesh".into()),
            (Collective::Stream | Collective::Latency, _) => {
                Err("the point-to-point modes run in p2p, not as a collective".into())
            }
        }
    }

    /// Wrong elements of this rank's result for `seed`.
    fn check(&self, b: &Buffers, seed: u64) -> u64 {
        let p = self.pattern(seed);
        let n = self.nranks;
        let per = self.layout.per;
        match self.coll {
            Collective::AllReduce => count_wrong(self.dtype, &b.output, |i| Expected::Reduced {
                pattern: p,
                nranks: n,
                index: i,
            }),
            Collective::AllGather => count_wrong(self.dtype, &b.output, |i| Expected::Input {
                pattern: p,
                rank: i / per,
                index: i % per,
            }),
            Collective::ReduceScatter => {
                let out = if b.inplace {
                    &b.output[self.my_block()]
                } else {
                    &b.output[..]
                };
                let first = self.rank * per;
                count_wrong(self.dtype, out, |i| Expected::Reduced {
                    pattern: p,
                    nranks: n,
                    index: first + i,
                })
            }
            Collective::Sendrecv => {
                let prev = (self.rank + n - 1) % n;
                count_wrong(self.dtype, &b.output, |i| Expected::Input {
                    pattern: p,
                    rank: prev,
                    index: i,
                })
            }
            // Not run here (see `call`): everything would be wrong.
            Collective::Stream | Collective::Latency => b.output.len() as u64,
            // Output block q holds rank q's input block for us.
            Collective::Alltoall => count_wrong(self.dtype, &b.output, |i| Expected::Input {
                pattern: p,
                rank: i / per,
                index: self.rank * per + i % per,
            }),
        }
    }

    /// Warm-up, timed iterations (µs per iteration, and this thread's CPU time and run-queue
    /// wait per iteration), then checked iterations.
    pub(super) fn measure(
        &self,
        ring: &mut Conns<'_>,
        boot: &mut Bootstrap,
        args: &Args,
        inplace: bool,
    ) -> Result<Measure> {
        let mut b = self.buffers(inplace);
        self.init(&mut b, 0);
        // Every call of this measurement, as a host launches them ahead of the GPU.
        ring.expect(self.plan, args.warmup_iters() + args.iters() + args.check);
        for _ in 0..args.warmup_iters() {
            self.call(ring, &mut b)?;
        }
        ring.drain()?;
        boot.barrier()?;
        let start = Instant::now();
        let (timed, used) = cputime::measure(|| -> Result<()> {
            for _ in 0..args.iters() {
                self.call(ring, &mut b)?;
            }
            Ok(())
        });
        timed?;
        let time_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(args.iters());
        // Sends still in flight are the network's, not the collective's (NCCL's kernel does
        // not wait for them): tested after the clock stops, before the checks.
        ring.drain()?;
        let mut wrong = None;
        for c in 0..args.check {
            let seed = u64::from(c) + 1;
            self.init(&mut b, seed);
            self.call(ring, &mut b)?;
            if args.debug_corrupt_rank == Some(self.rank) {
                corrupt(&mut b.output);
            }
            *wrong.get_or_insert(0) += self.check(&b, seed);
        }
        // The rank blocks in the rendezvous next.
        ring.drain()?;
        Ok(Measure {
            time_us,
            wrong,
            cpu: used.map(|u| CpuUse::per_iter(u, args.iters())),
        })
    }
}

/// Test hook: damages one byte in every 8 of a result buffer (so the rank's own block of an
/// in-place reduce-scatter is hit too).
fn corrupt(out: &mut [u8]) {
    for b in out.iter_mut().step_by(8) {
        *b ^= 0x5A;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_follow_nccl_tests_sizes() {
        let l = Layout::new(Collective::AllReduce, 1024, DataType::Float, 4);
        assert_eq!(
            (l.size, l.count, l.in_elems, l.out_elems),
            (1024, 256, 256, 256)
        );
        let l = Layout::new(Collective::AllGather, 1024, DataType::Float, 4);
        assert_eq!(
            (l.size, l.count, l.per, l.in_elems, l.out_elems),
            (1024, 256, 64, 64, 256)
        );
        let l = Layout::new(Collective::ReduceScatter, 1000, DataType::Float64, 3);
        // 125 elements / 3 ranks = 41 per rank; size rounds down to 123 elements.
        assert_eq!(
            (l.size, l.count, l.per, l.in_elems, l.out_elems),
            (984, 123, 41, 123, 41)
        );
        let l = Layout::new(Collective::AllGather, 8, DataType::Float, 4);
        assert_eq!((l.size, l.count), (0, 0));
        let l = Layout::new(Collective::Sendrecv, 10, DataType::Int32, 2);
        assert_eq!((l.size, l.count), (8, 2));
    }

    #[test]
    fn sentinel_is_never_an_expected_value() {
        let s = [SENTINEL; 8];
        let f = f32::from_ne_bytes(s[..4].try_into().unwrap());
        let i = i32::from_ne_bytes(s[..4].try_into().unwrap());
        let d = f64::from_ne_bytes(s);
        // Expected values are integers within ±16·nranks, ±500, or powers of two.
        assert!(f.abs() > 1e30 && !(f as f64).log2().fract().eq(&0.0));
        assert!(i > 1 << 30 && (i as u32).count_ones() > 1);
        assert!(d.abs() > 1e300 && !d.log2().fract().eq(&0.0));
    }

    /// The whole rank logic against an in-memory "ring" is covered by coll's simulation; here
    /// check that the checker flags an untouched output buffer.
    #[test]
    fn untouched_output_is_all_wrong() {
        let layout = Layout::new(Collective::AllReduce, 64, DataType::Float, 2);
        let plan = Plan::default();
        let job = Job {
            coll: Collective::AllReduce,
            proxy: Proxy::Eager,
            dtype: DataType::Float,
            op: RedOp::Sum,
            rank: 0,
            nranks: 2,
            layout,
            plan: &plan,
        };
        let mut b = job.buffers(false);
        job.init(&mut b, 1);
        assert_eq!(job.check(&b, 1), 16);
    }
}

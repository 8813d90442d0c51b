//! Element types, reduction operators, deterministic test data and its expected results.
//!
//! Every value is a small integer (stored as the element type), chosen per operator so that any
//! reduction order gives the exact same result in floating point: sums stay far below 2^24,
//! products are products of 1s and 2s (powers of two), min/max are exact by nature. Each rank
//! can therefore compute every other rank's input, and the exact expected output, locally.

use std::fmt;

/// Element type (`-d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataType {
    /// 32-bit IEEE float (nccl-tests "float").
    #[value(alias = "f32", alias = "float32")]
    Float,
    /// 32-bit signed integer.
    #[value(alias = "int", alias = "i32")]
    Int32,
    /// 64-bit IEEE float.
    #[value(name = "double", alias = "f64", alias = "float64")]
    Float64,
}

impl DataType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Float | DataType::Int32 => 4,
            DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints in the `type` column.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Float => "float",
            DataType::Int32 => "int32",
            DataType::Float64 => "double",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operator (`-o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl RedOp {
    /// The name printed in the `redop` column.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type the harness can generate, reduce and check.
pub trait Elem: Copy + PartialEq {
    /// Bytes per element.
    const SIZE: usize;
    /// The value for a small integer (exact in every type used).
    fn from_i64(v: i64) -> Self;
    /// Reads one element (native endianness) from exactly `SIZE` bytes.
    fn read(b: &[u8]) -> Self;
    /// Writes one element into exactly `SIZE` bytes.
    fn write(self, b: &mut [u8]);
    /// `op(a, b)`.
    fn apply(op: RedOp, a: Self, b: Self) -> Self;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().expect("SIZE bytes"))
            }
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            fn apply(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum => a + b,
                    RedOp::Prod => a * b,
                    RedOp::Min => a.min(b),
                    RedOp::Max => a.max(b),
                }
            }
        }
    };
}

float_elem!(f32);
float_elem!(f64);

impl Elem for i32 {
    const SIZE: usize = 4;
    fn from_i64(v: i64) -> Self {
        v as i32
    }
    fn read(b: &[u8]) -> Self {
        i32::from_ne_bytes(b.try_into().expect("SIZE bytes"))
    }
    fn write(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_ne_bytes());
    }
    fn apply(op: RedOp, a: Self, b: Self) -> Self {
        match op {
            RedOp::Sum => a.wrapping_add(b),
            RedOp::Prod => a.wrapping_mul(b),
            RedOp::Min => a.min(b),
            RedOp::Max => a.max(b),
        }
    }
}

/// Calls `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DataType::Float => {
                type $T = f32;
                $body
            }
            DataType::Int32 => {
                type $T = i32;
                $body
            }
            DataType::Float64 => {
                type $T = f64;
                $body
            }
        }
    };
}

/// What a data set is for: the value range depends on the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// Element type.
    pub dtype: DataType,
    /// Operator the values must stay exact under.
    pub op: RedOp,
    /// Distinguishes check iterations (different data each time).
    pub seed: u64,
}

impl Pattern {
    /// The integer value of element `index` of `rank`'s input.
    pub fn value(&self, rank: usize, index: usize) -> i64 {
        let h = mix(self.seed, rank as u64, index as u64);
        match self.op {
            // [-16, 16]: |sum| <= 16·nranks, exact.
            RedOp::Sum => (h % 33) as i64 - 16,
            // {1, 2}: products are powers of two (exact in floats; wrap identically in int32).
            RedOp::Prod => 1 + (h % 2) as i64,
            // [-500, 499].
            RedOp::Min | RedOp::Max => (h % 1000) as i64 - 500,
        }
    }

    /// The reduction over ranks `0..nranks` of element `index`.
    pub fn reduced<T: Elem>(&self, nranks: usize, index: usize) -> T {
        let mut acc = T::from_i64(self.value(0, index));
        for r in 1..nranks {
            acc = T::apply(self.op, acc, T::from_i64(self.value(r, index)));
        }
        acc
    }

    /// Fills `buf` with `rank`'s input, element `first + i` at position `i`.
    pub fn fill(&self, buf: &mut [u8], rank: usize, first: usize) {
        with_elem!(self.dtype, T => fill_typed::<T>(self, buf, rank, first))
    }
}

fn fill_typed<T: Elem>(p: &Pattern, buf: &mut [u8], rank: usize, first: usize) {
    for (i, b) in buf.chunks_exact_mut(T::SIZE).enumerate() {
        T::from_i64(p.value(rank, first + i)).write(b);
    }
}

/// A 64-bit mix of (seed, rank, index) (splitmix64 finaliser).
fn mix(seed: u64, rank: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(rank.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(index.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7))
        .wrapping_add(0x2545_F491_4F6C_DD1D);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `dst[i] = op(dst[i], src[i])` element-wise.
pub fn reduce_into(dtype: DataType, op: RedOp, dst: &mut [u8], src: &[u8]) {
    with_elem!(dtype, T => reduce_typed::<T>(op, dst, src))
}

fn reduce_typed<T: Elem>(op: RedOp, dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
        T::apply(op, T::read(d), T::read(s)).write(d);
    }
}

/// Counts the elements of `buf` that differ from `expected(i)` (element index in `buf`).
pub fn count_wrong(dtype: DataType, buf: &[u8], expected: impl Fn(usize) -> Expected) -> u64 {
    with_elem!(dtype, T => count_wrong_typed::<T>(buf, &expected))
}

/// An expected element: a plain input value, or a reduction over ranks.
#[derive(Clone, Copy, Debug)]
pub enum Expected {
    /// `pattern.value(rank, index)`.
    Input {
        /// Pattern.
        pattern: Pattern,
        /// Rank whose input it is.
        rank: usize,
        /// Element index in that rank's input.
        index: usize,
    },
    /// `pattern.reduced(nranks, index)`.
    Reduced {
        /// Pattern.
        pattern: Pattern,
        /// Ranks reduced.
        nranks: usize,
        /// Element index.
        index: usize,
    },
}

impl Expected {
    fn get<T: Elem>(self) -> T {
        match self {
            Expected::Input {
                pattern,
                rank,
                index,
            } => T::from_i64(pattern.value(rank, index)),
            Expected::Reduced {
                pattern,
                nranks,
                index,
            } => pattern.reduced(nranks, index),
        }
    }
}

fn count_wrong_typed<T: Elem>(buf: &[u8], expected: &dyn Fn(usize) -> Expected) -> u64 {
    let mut wrong = 0;
    for (i, b) in buf.chunks_exact(T::SIZE).enumerate() {
        if T::read(b) != expected(i).get::<T>() {
            wrong += 1;
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(dtype: DataType, op: RedOp) -> Pattern {
        Pattern { dtype, op, seed: 3 }
    }

    #[test]
    fn values_stay_in_range() {
        for i in 0..1000 {
            let s = pat(DataType::Float, RedOp::Sum).value(i % 7, i);
            assert!((-16..=16).contains(&s));
            let p = pat(DataType::Float, RedOp::Prod).value(i % 7, i);
            assert!(p == 1 || p == 2);
            let m = pat(DataType::Float, RedOp::Max).value(i % 7, i);
            assert!((-500..500).contains(&m));
        }
    }

    #[test]
    fn data_depends_on_rank_index_and_seed() {
        let a = pat(DataType::Float, RedOp::Max);
        let b = Pattern { seed: 4, ..a };
        let differs = |f: &dyn Fn(usize) -> (i64, i64)| (0..100).any(|i| f(i).0 != f(i).1);
        assert!(differs(&|i| (a.value(0, i), a.value(1, i))));
        assert!(differs(&|i| (a.value(0, i), b.value(0, i))));
        assert!(differs(&|i| (a.value(0, i), a.value(0, i + 1))));
    }

    #[test]
    fn expected_reduction_matches_manual_fold() {
        let p = pat(DataType::Int32, RedOp::Sum);
        for i in 0..50 {
            let manual: i64 = (0..4).map(|r| p.value(r, i)).sum();
            assert_eq!(p.reduced::<i32>(4, i) as i64, manual);
        }
        let p = pat(DataType::Float64, RedOp::Max);
        for i in 0..50 {
            let manual = (0..3).map(|r| p.value(r, i)).max().unwrap();
            assert_eq!(p.reduced::<f64>(3, i), manual as f64);
        }
        let p = pat(DataType::Float, RedOp::Prod);
        for i in 0..50 {
            let manual: i64 = (0..5).map(|r| p.value(r, i)).product();
            assert_eq!(p.reduced::<f32>(5, i), manual as f32);
        }
    }

    #[test]
    fn float_sums_are_order_independent() {
        // Reduce ranks in a ring order different from 0..n and compare bit for bit.
        let p = pat(DataType::Float, RedOp::Sum);
        let n = 8;
        let count = 257;
        let mut bufs: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut b = vec![0u8; count * 4];
                p.fill(&mut b, r, 0);
                b
            })
            .collect();
        let mut acc = bufs.pop().unwrap();
        for b in bufs.iter().rev() {
            reduce_into(DataType::Float, RedOp::Sum, &mut acc, b);
        }
        let wrong = count_wrong(DataType::Float, &acc, |i| Expected::Reduced {
            pattern: p,
            nranks: n,
            index: i,
        });
        assert_eq!(wrong, 0);
    }

    #[test]
    fn count_wrong_counts_corruption() {
        let p = pat(DataType::Int32, RedOp::Min);
        let mut b = vec![0u8; 64 * 4];
        p.fill(&mut b, 2, 10);
        let exp = |i| Expected::Input {
            pattern: p,
            rank: 2,
            index: 10 + i,
        };
        assert_eq!(count_wrong(DataType::Int32, &b, exp), 0);
        b[5 * 4] ^= 0x40;
        b[9 * 4 + 3] ^= 0x01;
        assert_eq!(count_wrong(DataType::Int32, &b, exp), 2);
    }

    #[test]
    fn int32_prod_wraps_consistently() {
        let mut a = vec![0u8; 4];
        i32::MAX.write(&mut a);
        let mut b = vec![0u8; 4];
        2i32.write(&mut b);
        reduce_into(DataType::Int32, RedOp::Prod, &mut a, &b);
        assert_eq!(i32::read(&a), i32::MAX.wrapping_mul(2));
    }
}

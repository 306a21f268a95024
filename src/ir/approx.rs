//! Approximations that a kernel chooses explicitly: `fast_exp` (TVM's `fast_exp`, which its
//! `fast_softmax` uses).
//!
//! An approximation is part of the IR's semantics, not a code generator's choice: the
//! constants and the order of operations are defined here once, and the interpreter (the
//! oracle), the LLVM backend and the OpenCL backend all compute exactly this sequence with
//! correctly rounded fused multiply-adds, so they agree bit for bit. That is what lets a
//! differential test compare them exactly, and what makes a kernel's result the same on every
//! machine.
//!
//! # `fast_exp` on float32
//! 1. `x` is clamped to [[`FAST_EXP_LO`], [`FAST_EXP_HI`]], so results saturate at about
//!    `1.65e38` and `1.65e-38`, never infinity or a subnormal. A NaN gives a NaN: the
//!    interpreter returns the input, compiled code the NaN its arithmetic carries through
//!    (which NaN is not specified, as for every float operation);
//! 2. `k = floor(fma(x, log2(e), 0.5))`, `r = fma(k, -LN2_HI, x)`, `r = fma(k, LN2_LO, r)`
//!    (Cody-Waite reduction, `|r| <= ln2 / 2`);
//! 3. `p` = Horner's rule over [`FAST_EXP_POLY`] with `fma(p, r, c)`; `y = fma(p, r * r, r) + 1`;
//! 4. the result is `y * 2^k`, `2^k` built in the exponent bits.
//!
//! Measured against `exp` computed in `f64` over every 97th float32 of the clamp range
//! (`fast_exp_is_within_two_ulp_of_exp` in `tests/tir_scalar.rs`): at most 1 ulp; the bound
//! promised (and tested) is 2 ulp.

// The constants are written in f64 and used rounded to float32 (`as f32`), as the code
// generators write them.

/// The lower clamp of the input.
pub const FAST_EXP_LO: f64 = -87.0;
/// The upper clamp of the input.
pub const FAST_EXP_HI: f64 = 88.0;
/// The lower clamp of compiled float32 `exp` (not an approximation: `e^-104` rounds to 0).
pub const EXP_LO: f64 = -104.0;
/// The upper clamp of compiled float32 `exp` (`e^89` overflows to infinity).
pub const EXP_HI: f64 = 89.0;
/// `1.5 * 2^23`: added to a float32 of magnitude below `2^22`, it rounds it to an integer
/// held in the low mantissa bits (compiled `exp`'s range reduction).
pub const EXP_ROUND: f64 = 12_582_912.0;
/// Compiled float32 `erf`: below this `|x|`, `erf(x) = x * P(x^2)` ([`ERF_SMALL_POLY`]).
pub const ERF_SPLIT: f64 = 0.921_875;
/// Compiled float32 `erf`: `|x|` is clamped to this (where `erf` is 1 in float32).
pub const ERF_CLAMP: f64 = 3.92;
/// Compiled float32 `erf` above [`ERF_SPLIT`]: `erf(x) = 1 - exp(-x^2) * R(x - ERF_CENTER)`.
pub const ERF_CENTER: f64 = 2.420_937_5;
/// `P` of `erf(x) / x` in `x^2` on `[0, ERF_SPLIT]`, lowest degree first (a least-squares fit of
/// relative error on Chebyshev nodes, reweighted towards minimax).
pub const ERF_SMALL_POLY: [f64; 7] = [
    1.128_379_225_730_896,
    -0.376_126_378_774_642_94,
    0.112_837_411_463_260_65,
    -0.026_861_714_199_185_37,
    0.005_206_419_155_001_64,
    -0.000_820_063_229_184_597_7,
    8.603_879_541_624_337e-5,
];
/// `R` of `exp(x^2) * erfc(x)` in `x - ERF_CENTER` on `[ERF_SPLIT, ERF_CLAMP]`, lowest degree
/// first (a least-squares fit of relative error on Chebyshev nodes).
pub const ERF_LARGE_POLY: [f64; 12] = [
    0.216_844_379_901_886,
    -0.078_445_762_395_858_76,
    0.026_932_375_505_566_597,
    -0.008_829_668_164_253_235,
    0.002_776_673_063_635_826,
    -0.000_842_052_802_909_165_6,
    0.000_248_908_763_751_387_6,
    -7.006_754_458_416_253e-5,
    1.731_048_723_740_969e-5,
    -4.910_779_352_940_153e-6,
    2.092_119_984_808_96e-6,
    -4.890_153_491_032_834e-7,
];
/// `log2(e)`.
pub const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// The high part of ln 2 (355 / 512, exact in float32 with few mantissa bits, so `k * LN2_HI`
/// is exact).
pub const LN2_HI: f64 = 0.693_359_375;
/// `LN2_HI - ln 2`, the low part, added back.
pub const LN2_LO: f64 = 2.121_944_40e-4;
/// The polynomial for `(e^r - 1 - r) / r^2`, highest degree first.
pub const FAST_EXP_POLY: [f64; 6] = [
    1.987_569_150_0e-4,
    1.398_199_950_7e-3,
    8.333_451_907_3e-3,
    4.166_579_589_4e-2,
    1.666_666_545_9e-1,
    5.000_000_120_1e-1,
];

/// `fast_exp` on float32, the reference every backend matches bit for bit.
pub fn fast_exp_f32(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(FAST_EXP_LO as f32, FAST_EXP_HI as f32);
    let k = x.mul_add(LOG2_E as f32, 0.5).floor();
    let r = k.mul_add(-LN2_HI as f32, x);
    let r = k.mul_add(LN2_LO as f32, r);
    let mut p = FAST_EXP_POLY[0] as f32;
    for &c in &FAST_EXP_POLY[1..] {
        p = p.mul_add(r, c as f32);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // k is in [-126, 127] after the clamp: 2^k is a normal float32.
    let scale = f32::from_bits((((k as i32) + 127) as u32) << 23);
    y * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_edges() {
        assert_eq!(fast_exp_f32(0.0), 1.0);
        assert!(fast_exp_f32(f32::NAN).is_nan());
        assert_eq!(fast_exp_f32(f32::INFINITY), fast_exp_f32(88.0));
        assert_eq!(fast_exp_f32(f32::NEG_INFINITY), fast_exp_f32(-87.0));
        assert!(fast_exp_f32(88.0).is_finite() && fast_exp_f32(-87.0) > 0.0);
        let rel = |x: f32| ((fast_exp_f32(x) as f64 - (x as f64).exp()) / (x as f64).exp()).abs();
        for x in [-87.0f32, -20.5, -1.0, -1e-3, 1e-3, 0.5, 1.0, 10.0, 88.0] {
            assert!(rel(x) < 3e-7, "fast_exp({x}) relative error {}", rel(x));
        }
    }
}

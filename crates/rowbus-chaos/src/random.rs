//! A small xorshift generator: the harness's coin flips and jitter, seeded per task.

/// Not for anything but spreading faults and delays.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` and the clock (never zero).
    pub(crate) fn new(seed: u64) -> Self {
        let clock = super::time::now_us() as u64;
        Rng((seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ clock) | 1)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A duration uniform in [0, max).
    pub(crate) fn below(&mut self, max: std::time::Duration) -> std::time::Duration {
        max.mul_f64(self.unit())
    }
}

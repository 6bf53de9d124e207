//! When a failed message runs again.

use std::time::Duration;

/// Retries with exponential backoff up to a maximum of attempts; then the message goes to
/// the dead-letter table with its last error.
///
/// ```
/// use std::time::Duration;
/// use rowbus::RetryPolicy;
/// let policy = RetryPolicy::default();
/// assert_eq!(policy.delay(1), Duration::from_secs(1));
/// assert_eq!(policy.delay(3), Duration::from_secs(4));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; a message that fails this often is dead-lettered.
    pub max_attempts: u32,
    /// The wait after the first failure.
    pub base: Duration,
    /// The factor the wait grows by with each further failure.
    pub factor: f64,
    /// The longest wait.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(600),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt number `attempt` (1 for the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let secs = self.base.as_secs_f64() * self.factor.max(1.0).powi(exponent);
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_delay).min(self.max_delay)
    }

    /// Whether a message that has failed `attempts` times is done for.
    pub fn exhausted(&self, attempts: u32) -> bool {
        attempts >= self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_and_capped() {
        let p = RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(100),
            factor: 3.0,
            max_delay: Duration::from_secs(1),
        };
        assert_eq!(p.delay(1), Duration::from_millis(100));
        assert_eq!(p.delay(2), Duration::from_millis(300));
        assert_eq!(p.delay(3), Duration::from_millis(900));
        assert_eq!(p.delay(4), Duration::from_secs(1));
        assert_eq!(p.delay(10_000), Duration::from_secs(1));
        assert!(!p.exhausted(2));
        assert!(p.exhausted(3));
    }
}

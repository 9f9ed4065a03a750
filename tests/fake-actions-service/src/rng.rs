//! A tiny seedable generator (SplitMix64) for ids, tokens and fault decisions.
//!
//! Fault injection must be reproducible from a seed, and ids/tokens only need to be unique within one fake, so
//! a cryptographic generator would add a dependency without serving anything.

/// SplitMix64 (Steele, Lea, Flood 2014): passes BigCrush, one `u64` of state.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `len` characters from `[A-Za-z0-9]`.
    pub fn alphanumeric(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| {
                let index = (self.next_u64() % ALPHANUMERIC.len() as u64) as usize;
                char::from(ALPHANUMERIC[index])
            })
            .collect()
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64().to_le_bytes()[0]).collect()
    }

    /// A random (version 4) UUID in canonical lower-case hyphenated form.
    pub fn uuid(&mut self) -> String {
        let high = self.next_u64();
        let low = self.next_u64();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&high.to_be_bytes());
        bytes[8..].copy_from_slice(&low.to_be_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(SplitMix64::new(8).next_u64(), xs[0]);
    }

    #[test]
    fn floats_are_in_unit_interval_and_spread() {
        let mut rng = SplitMix64::new(1);
        let draws: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
        assert!(draws.iter().all(|x| (0.0..1.0).contains(x)));
        let below_half = draws.iter().filter(|x| **x < 0.5).count();
        assert!((4_500..5_500).contains(&below_half), "{below_half}");
    }

    #[test]
    fn uuid_is_canonical_v4() {
        let uuid = SplitMix64::new(3).uuid();
        assert_eq!(uuid.len(), 36);
        assert_eq!(&uuid[14..15], "4");
        assert!(matches!(&uuid[19..20], "8" | "9" | "a" | "b"));
        assert!(
            uuid.chars()
                .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn alphanumeric_has_requested_length() {
        let token = SplitMix64::new(4).alphanumeric(29);
        assert_eq!(token.len(), 29);
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}

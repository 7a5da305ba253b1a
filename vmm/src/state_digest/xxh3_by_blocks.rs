//! XXH3-64 (seed 0, the default secret) of all guest RAM, block by block,
//! equal to `xxhash_rust::xxh3::xxh3_64` of the same bytes, with a block of
//! zeros costing a few additions instead of 128 multiplications.
//!
//! Why by hand: a memory digest hashes every byte of RAM at each state
//! check, and most of a small guest's RAM is pages it never touched. On a
//! host that emulates its CPU (the test beds' L1s, under QEMU's TCG and
//! Bochs) the hash was half of every `provm record` and `provm replay`'s
//! own time (perf, in the SVM bed's L1: `state_digest::memory` 47% of a
//! record of `echo hi`). XXH3's accumulator only adds a constant for each
//! stripe of zeros (`ZERO_BLOCK`), but no crate lets a caller step its
//! state a block at a time. The digest is what traces store, so it is
//! XXH3-64 exactly: the constants are the XXH3 specification's
//! (xxhash's doc/xxhash_spec.md), and the tests compare with xxhash-rust.

/// The specification's default secret (kSecret), 192 bytes.
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

const STRIPE: usize = 64;
/// Stripes per block with the default secret: (192 - 64) / 8.
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
/// The bytes between two scrambles of the accumulators.
pub const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;

/// The little-endian word at `at` in the secret.
const fn secret_word(at: usize) -> u64 {
    let mut word = 0;
    let mut byte = 0;
    while byte < 8 {
        word |= (SECRET[at + byte] as u64) << (8 * byte);
        byte += 1;
    }
    word
}

/// What a block of zeros adds to each accumulator: a zero lane's key is
/// the secret's word itself, and the lane beside it gains nothing.
const ZERO_BLOCK: [u64; 8] = {
    let mut sums = [0u64; 8];
    let mut stripe = 0;
    while stripe < STRIPES_PER_BLOCK {
        let mut lane = 0;
        while lane < 8 {
            let key = secret_word(8 * stripe + 8 * lane);
            sums[lane] = sums[lane].wrapping_add((key & 0xFFFF_FFFF) * (key >> 32));
            lane += 1;
        }
        stripe += 1;
    }
    sums
};

/// The hash of bytes fed a block at a time; the last block goes to
/// `finish`, which needs it whole.
pub struct Xxh3ByBlocks {
    acc: [u64; 8],
    len: u64,
}

impl Xxh3ByBlocks {
    pub fn new() -> Self {
        Xxh3ByBlocks {
            acc: [
                PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5,
                PRIME32_1,
            ],
            len: 0,
        }
    }

    /// Feeds one block that is not the input's last.
    pub fn block(&mut self, block: &[u8; BLOCK]) {
        for (stripe, bytes) in block.chunks_exact(STRIPE).enumerate() {
            self.accumulate(bytes, 8 * stripe);
        }
        self.end_block();
    }

    /// Feeds one block of zeros that is not the input's last: as `block`
    /// does, in a few additions.
    pub fn zeros(&mut self) {
        for (acc, add) in self.acc.iter_mut().zip(ZERO_BLOCK) {
            *acc = acc.wrapping_add(add);
        }
        self.end_block();
    }

    fn end_block(&mut self) {
        self.scramble();
        self.len += BLOCK as u64;
    }

    /// The digest of everything fed, `last` being the input's last block.
    pub fn finish(mut self, last: &[u8; BLOCK]) -> u64 {
        let len = self.len + BLOCK as u64;
        // Every stripe but the last whole one, then the input's last 64
        // bytes with the secret's last stripe, as the specification does
        // for an input whose length is a multiple of the block.
        for (stripe, bytes) in last
            .chunks_exact(STRIPE)
            .take(STRIPES_PER_BLOCK - 1)
            .enumerate()
        {
            self.accumulate(bytes, 8 * stripe);
        }
        self.accumulate(&last[BLOCK - STRIPE..], SECRET.len() - STRIPE - 7);
        let mut result = len.wrapping_mul(PRIME64_1);
        for pair in 0..4 {
            let secret = 11 + 16 * pair;
            result = result.wrapping_add(fold(
                self.acc[2 * pair] ^ secret_word(secret),
                self.acc[2 * pair + 1] ^ secret_word(secret + 8),
            ));
        }
        avalanche(result)
    }

    fn accumulate(&mut self, stripe: &[u8], secret: usize) {
        for (lane, bytes) in stripe.chunks_exact(8).enumerate() {
            let data = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            let key = data ^ secret_word(secret + 8 * lane);
            self.acc[lane ^ 1] = self.acc[lane ^ 1].wrapping_add(data);
            self.acc[lane] = self.acc[lane].wrapping_add((key & 0xFFFF_FFFF) * (key >> 32));
        }
    }

    fn scramble(&mut self) {
        for (lane, acc) in self.acc.iter_mut().enumerate() {
            let mut value = *acc;
            value ^= value >> 47;
            value ^= secret_word(SECRET.len() - STRIPE + 8 * lane);
            *acc = value.wrapping_mul(PRIME32_1);
        }
    }
}

/// The 128-bit product folded to 64 bits.
fn fold(left: u64, right: u64) -> u64 {
    let product = u128::from(left) * u128::from(right);
    product as u64 ^ (product >> 64) as u64
}

fn avalanche(mut value: u64) -> u64 {
    value ^= value >> 37;
    value = value.wrapping_mul(0x1656_6791_9E37_79F9);
    value ^ (value >> 32)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use xxhash_rust::xxh3::xxh3_64;

    use super::*;

    /// The digest of `bytes`, a block of zeros fed as `zeros` where
    /// `skip_zeros` holds, as `block` where not.
    fn by_blocks(bytes: &[u8], skip_zeros: bool) -> u64 {
        let mut hash = Xxh3ByBlocks::new();
        let (rest, last) = bytes.split_at(bytes.len() - BLOCK);
        for block in rest.chunks_exact(BLOCK) {
            match skip_zeros && crate::memory::is_zero(block) {
                true => hash.zeros(),
                false => hash.block(block.try_into().unwrap()),
            }
        }
        hash.finish(last.try_into().unwrap())
    }

    #[test]
    fn zeros_digest_as_xxh3_does_either_way() {
        for blocks in [1, 2, 4, 17, 4096] {
            let zeros = vec![0u8; blocks * BLOCK];
            for skip_zeros in [true, false] {
                assert_eq!(
                    by_blocks(&zeros, skip_zeros),
                    xxh3_64(&zeros),
                    "{blocks} blocks, skipping zeros: {skip_zeros}"
                );
            }
        }
    }

    proptest! {
        /// Blocks of zeros, of bytes and of a byte set here and there, in
        /// any order: the same digest as xxhash-rust's.
        #[test]
        fn any_blocks_digest_as_xxh3_does(
            kinds in proptest::collection::vec((0u8..3, any::<u64>()), 1..40)
        ) {
            let mut bytes = Vec::new();
            for (kind, seed) in kinds {
                let mut block = [0u8; BLOCK];
                match kind {
                    0 => {}
                    1 => block[(seed % BLOCK as u64) as usize] = (seed >> 32) as u8 | 1,
                    _ => block
                        .iter_mut()
                        .enumerate()
                        .for_each(|(i, b)| *b = (seed.rotate_left(i as u32 % 64) >> 7) as u8),
                }
                bytes.extend_from_slice(&block);
            }
            prop_assert_eq!(by_blocks(&bytes, true), xxh3_64(&bytes));
        }
    }
}

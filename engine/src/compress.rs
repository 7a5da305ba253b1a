//! zstd for data that may not compress: the input disk holds the user's
//! data, often compressed already (archives, images, HDF5 with its
//! filters) or random. Trying to compress such bytes costs as
//! much as compressing: 1 GiB of random bytes took 20 s at `zstd -1` and
//! at `--fast=20` alike on the SVM test bed, against 2 s to copy it. So
//! each MiB is judged by a sample first, and a MiB whose sample does not
//! shrink is stored as it is.
//!
//! The result is one ordinary zstd stream: runs of compressed MiBs as zstd
//! frames, the rest as frames of raw blocks, one after another, which any
//! zstd decoder reads (RFC 8878 section 3.1: a stream is frames in a row).

use std::io::{self, Read, Write};

use provm_trace::format::read_full;

/// How much is judged at a time.
const STRETCH: usize = 1 << 20;
/// The sample: this many pieces of this size, spread over the stretch.
const SAMPLE_PIECES: usize = 4;
const SAMPLE_PIECE: usize = 4096;
/// The largest block a frame may hold (RFC 8878 3.1.1.2.3).
const MAX_BLOCK: usize = 128 << 10;

/// `from` as one zstd stream at `level` (compressed on `threads` threads
/// besides this one), with what does not compress stored raw.
pub fn compress_where_it_pays(
    from: &mut impl Read,
    level: i32,
    threads: u32,
) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut encoder: Option<zstd::stream::Encoder<'static, Vec<u8>>> = None;
    let mut stretch = vec![0; STRETCH];
    let mut judge = zstd::bulk::Compressor::new(level)?;
    loop {
        let len = read_full(from, &mut stretch)?;
        if len == 0 {
            break;
        }
        let data = &stretch[..len];
        if compresses(&mut judge, data)? {
            if encoder.is_none() {
                let mut started = zstd::stream::Encoder::new(std::mem::take(&mut out), level)?;
                started.multithread(threads)?;
                encoder = Some(started);
            }
            encoder.as_mut().expect("started above").write_all(data)?;
        } else {
            if let Some(running) = encoder.take() {
                out = running.finish()?;
            }
            write_raw_frame(&mut out, data);
        }
    }
    match encoder {
        Some(running) => running.finish(),
        // An empty input is still a stream: one empty frame.
        None if out.is_empty() => {
            write_raw_frame(&mut out, &[]);
            Ok(out)
        }
        None => Ok(out),
    }
}

/// Whether a sample of `data` shrinks by more than 1/32 through `judge`.
fn compresses(judge: &mut zstd::bulk::Compressor, data: &[u8]) -> io::Result<bool> {
    let sample: Vec<u8> = if data.len() <= SAMPLE_PIECES * SAMPLE_PIECE {
        data.to_vec()
    } else {
        let step = data.len() / SAMPLE_PIECES;
        (0..SAMPLE_PIECES)
            .flat_map(|piece| &data[piece * step..piece * step + SAMPLE_PIECE])
            .copied()
            .collect()
    };
    let compressed = judge.compress(&sample)?;
    Ok(compressed.len() < sample.len() - sample.len() / 32)
}

/// Appends a zstd frame that holds `data` in raw blocks (RFC 8878 3.1.1).
/// Written here because libzstd has no call that stores a block without
/// first trying to compress it, which is the cost this module avoids.
fn write_raw_frame(out: &mut Vec<u8>, data: &[u8]) {
    const MAGIC: u32 = 0xFD2F_B528;
    // Frame header descriptor: an 8-byte content size (flag 3, bits 7-6),
    // a single segment (bit 5: no window descriptor, the window is the
    // content), no checksum, no dictionary.
    const DESCRIPTOR: u8 = 0b1110_0000;
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(DESCRIPTOR);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let blocks = data.len().div_ceil(MAX_BLOCK).max(1);
    for index in 0..blocks {
        let block =
            &data[(index * MAX_BLOCK).min(data.len())..((index + 1) * MAX_BLOCK).min(data.len())];
        // Block header, 3 bytes little-endian: last block (bit 0), type
        // (bits 1-2, 0 = raw), size (bits 3-23).
        let last = u32::from(index + 1 == blocks);
        let header = last | (block.len() as u32) << 3;
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that do not compress (xorshift), `len` of them.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    fn round_trip(data: &[u8]) -> Vec<u8> {
        let stream = compress_where_it_pays(&mut &data[..], 1, 0).unwrap();
        // The stream is what the trace holds; read back as the replay does.
        let mut decoder = zstd::stream::write::Decoder::new(Vec::new()).unwrap();
        decoder.write_all(&stream).unwrap();
        decoder.flush().unwrap();
        assert_eq!(decoder.into_inner(), data);
        stream
    }

    #[test]
    fn noise_is_stored_raw_and_reads_back() {
        let data = noise(3 * STRETCH + 12345, 7);
        let stream = round_trip(&data);
        // Four frames of raw blocks: the data and a few bytes per block.
        let blocks = 3 * STRETCH / MAX_BLOCK + 1;
        assert_eq!(stream.len(), data.len() + 4 * 13 + blocks * 3);
    }

    #[test]
    fn what_compresses_is_compressed_between_raw_stretches() {
        let mut data = vec![0u8; 2 * STRETCH];
        data.extend(noise(STRETCH, 3));
        data.extend(b"the same words again and again. ".repeat(STRETCH / 16));
        data.extend(noise(1000, 5));
        let stream = round_trip(&data);
        // The noise (1 MiB and 1000 bytes) raw, the rest nearly nothing.
        assert!(stream.len() > STRETCH + 1000, "{}", stream.len());
        assert!(
            stream.len() < STRETCH + 1000 + (64 << 10),
            "{}",
            stream.len()
        );
    }

    #[test]
    fn an_empty_input_is_an_empty_stream() {
        round_trip(&[]);
    }

    #[test]
    fn a_block_of_exactly_the_largest_size_is_one_block() {
        let data = noise(MAX_BLOCK, 9);
        let stream = round_trip(&data);
        assert_eq!(stream.len(), data.len() + 13 + 3);
    }
}

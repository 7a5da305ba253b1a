//! Where memory differs: the digests of every page of guest RAM, piece by
//! piece, kept with each state check (the "page digests" section, format
//! 8). A check's memory digest says only that memory differs; comparing
//! these names the guest-physical pages that do, and the first piece of
//! each that differs.
//!
//! Each 4 KiB page is digested as 16 pieces of 256 bytes, 16 bits each:
//! 32 bytes a page, 1 MiB a check of 128 MiB (zstd leaves far less: zero
//! pages all digest alike). A piece that differs has a 1 in 65,536 chance
//! of digesting alike; the check's own 64-bit digest still decides the
//! verdict, these only say where.

use std::io::Read;

use crate::format::FormatError;

/// Bytes of guest RAM a page is.
pub const PAGE_SIZE: usize = 4096;
/// Bytes a piece digest covers.
pub const PIECE_SIZE: usize = 256;
/// Pieces a page is digested in.
pub const PIECES_PER_PAGE: usize = PAGE_SIZE / PIECE_SIZE;

/// Which state check a set of page digests belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckPoint {
    /// A periodic memory check, at the log position of its `StateCheck`
    /// event.
    Event(u64),
    /// The final check, at the guest's power-off.
    PowerOff,
}

impl CheckPoint {
    const POWER_OFF: u64 = u64::MAX;

    fn encoded(self) -> u64 {
        match self {
            CheckPoint::Event(event) => event,
            CheckPoint::PowerOff => Self::POWER_OFF,
        }
    }

    fn decoded(value: u64) -> Self {
        match value {
            Self::POWER_OFF => CheckPoint::PowerOff,
            event => CheckPoint::Event(event),
        }
    }
}

/// The piece digests of all guest RAM at one check, page after page
/// from guest-physical address 0, `PIECES_PER_PAGE` a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageDigests {
    pub at: CheckPoint,
    pub pieces: Vec<u16>,
}

/// A page whose digests differ, and the first of its pieces that does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageDifference {
    /// Its guest-physical address.
    pub address: u64,
    /// The offset in the page of the first piece that differs.
    pub first_piece: usize,
}

impl PageDigests {
    /// The pages whose digests differ between `self` (recorded) and
    /// `replayed`, in address order. Memory of another size differs in
    /// every page beyond the smaller.
    pub fn differences(&self, replayed: &[u16]) -> Vec<PageDifference> {
        let pages = self.pieces.len().max(replayed.len()) / PIECES_PER_PAGE;
        (0..pages)
            .filter_map(|page| {
                let range = page * PIECES_PER_PAGE..(page + 1) * PIECES_PER_PAGE;
                let recorded = self.pieces.get(range.clone()).unwrap_or_default();
                let replayed = replayed.get(range).unwrap_or_default();
                let first = (0..PIECES_PER_PAGE)
                    .find(|&piece| recorded.get(piece) != replayed.get(piece))?;
                Some(PageDifference {
                    address: (page * PAGE_SIZE) as u64,
                    first_piece: first * PIECE_SIZE,
                })
            })
            .collect()
    }
}

/// The section's payload: each check as its point (u64 LE, `u64::MAX`
/// for the power-off), the length of its compressed pieces (u64 LE), and
/// those (zstd over the pieces as u16 LE).
pub fn encode_check(check: &PageDigests) -> Vec<u8> {
    let raw: Vec<u8> = check.pieces.iter().flat_map(|p| p.to_le_bytes()).collect();
    let compressed = zstd::encode_all(&raw[..], 3).expect("compressing in memory cannot fail");
    let mut out = Vec::with_capacity(16 + compressed.len());
    out.extend_from_slice(&check.at.encoded().to_le_bytes());
    out.extend_from_slice(&(compressed.len() as u64).to_le_bytes());
    out.extend_from_slice(&compressed);
    out
}

/// The checks a section's payload holds (see `encode_check`).
pub fn decode(mut payload: &[u8]) -> Result<Vec<PageDigests>, FormatError> {
    let bad = |reason: String| FormatError::Decode {
        index: 0,
        kind: "page digests",
        reason,
    };
    let mut checks = Vec::new();
    while !payload.is_empty() {
        let (at, rest) = take_u64(payload).ok_or_else(|| bad("a check is cut short".into()))?;
        let (len, rest) = take_u64(rest).ok_or_else(|| bad("a check is cut short".into()))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len <= rest.len())
            .ok_or_else(|| bad(format!("a check claims {len} bytes, {} remain", rest.len())))?;
        let mut raw = Vec::new();
        zstd::Decoder::new(&rest[..len])
            .and_then(|mut decoder| decoder.read_to_end(&mut raw))
            .map_err(|error| bad(format!("a check does not decompress: {error}")))?;
        if raw.len() % (2 * PIECES_PER_PAGE) != 0 {
            return Err(bad(format!(
                "a check holds {} bytes, not whole pages",
                raw.len()
            )));
        }
        let pieces = raw
            .chunks_exact(2)
            .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
            .collect();
        checks.push(PageDigests {
            at: CheckPoint::decoded(at),
            pieces,
        });
        payload = &rest[len..];
    }
    Ok(checks)
}

fn take_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*head), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(at: CheckPoint, pages: usize) -> PageDigests {
        PageDigests {
            at,
            pieces: (0..pages * PIECES_PER_PAGE).map(|i| i as u16).collect(),
        }
    }

    #[test]
    fn checks_decode_as_encoded() {
        let checks = [
            check(CheckPoint::Event(7), 3),
            check(CheckPoint::PowerOff, 2),
        ];
        let payload: Vec<u8> = checks.iter().flat_map(encode_check).collect();
        assert_eq!(decode(&payload).unwrap(), checks);
        assert!(decode(&payload[..payload.len() - 1]).is_err());
    }

    #[test]
    fn a_changed_piece_names_its_page_and_offset() {
        let recorded = check(CheckPoint::PowerOff, 4);
        let mut replayed = recorded.pieces.clone();
        replayed[2 * PIECES_PER_PAGE + 5] ^= 1;
        replayed[2 * PIECES_PER_PAGE + 9] ^= 1;
        assert_eq!(
            recorded.differences(&replayed),
            [PageDifference {
                address: 2 * PAGE_SIZE as u64,
                first_piece: 5 * PIECE_SIZE,
            }]
        );
        assert!(recorded.differences(&recorded.pieces).is_empty());
    }
}

//! The channel's framing and its field codec. The channel is a byte stream
//! (the guest's virtio console, /dev/hvc0, in raw mode). Every message is
//! one frame: a kind byte, a little-endian u32 payload length, then the
//! payload. Payload fields are length-prefixed byte strings and
//! little-endian integers, written and read here for the messages
//! (`message`), the job (`job`), the provenance records (`records`) and
//! the file trees (`tree`).

/// Largest payload either side accepts; a longer frame means a corrupt stream.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Bytes of frame header: kind (1) and payload length (4).
pub const HEADER_LEN: usize = 5;

/// A frame that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    UnknownKind(u8),
    TooLong(usize),
    Truncated,
    /// A field whose value is out of its range: what it is.
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownKind(kind) => write!(f, "unknown message kind {kind}"),
            DecodeError::TooLong(len) => write!(f, "payload of {len} bytes exceeds {MAX_PAYLOAD}"),
            DecodeError::Truncated => write!(f, "payload ends inside a field"),
            DecodeError::Malformed(field) => write!(f, "{field} is out of range"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Splits a byte stream into frames; feed it bytes as they arrive.
///
/// A bad frame header ends the stream: with length-prefixed frames nothing
/// after it can be found again. The reader then keeps no more bytes (they
/// would pile up for ever) and gives the same error at every call.
#[derive(Clone, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
    broken: Option<DecodeError>,
}

impl FrameReader {
    /// Whether a bad frame has ended the stream.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.broken.is_none() {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// The next complete frame as (kind, payload), if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, DecodeError> {
        if let Some(error) = &self.broken {
            return Err(error.clone());
        }
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buffer[1..HEADER_LEN].try_into().unwrap()) as usize;
        if len > MAX_PAYLOAD {
            self.buffer = Vec::new();
            let error = DecodeError::TooLong(len);
            self.broken = Some(error.clone());
            return Err(error);
        }
        if self.buffer.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let kind = self.buffer[0];
        let payload = self.buffer[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buffer.drain(..HEADER_LEN + len);
        Ok(Some((kind, payload)))
    }
}

pub(crate) fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    frame_head(kind, payload, 0)
}

/// The frame of a payload of `head` then `tail_len` more bytes, up to
/// those bytes: they follow it.
pub(crate) fn frame_head(kind: u8, head: &[u8], tail_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + head.len());
    out.push(kind);
    out.extend_from_slice(&((head.len() + tail_len) as u32).to_le_bytes());
    out.extend_from_slice(head);
    out
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

pub(crate) fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    put_u32(out, items.len() as u32);
    for item in items {
        put_bytes(out, item);
    }
}

pub(crate) fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Reads a payload's fields in order.
pub(crate) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn new(payload: &'a [u8]) -> Self {
        Reader(payload)
    }

    /// Whether every field has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&[u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    pub(crate) fn bool(&mut self) -> Result<bool, DecodeError> {
        Ok(self.u8()? != 0)
    }

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    pub(crate) fn list(&mut self) -> Result<Vec<Vec<u8>>, DecodeError> {
        let count = self.u32()? as usize;
        // Each item needs at least its 4-byte length: bounds the allocation.
        if count > self.0.len() / 4 {
            return Err(DecodeError::Truncated);
        }
        (0..count).map(|_| self.bytes()).collect()
    }

    /// Trailing bytes mean the two sides disagree on the format.
    pub(crate) fn finish<T>(self, value: T) -> Result<T, DecodeError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(DecodeError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a bad header nothing more is kept, and the error stays.
    #[test]
    fn a_broken_stream_keeps_no_more_bytes_and_stays_broken() {
        let mut reader = FrameReader::default();
        // A Stdout frame (kind 0x82) of 4 GiB - 1.
        reader.push(&[0x82, 0xff, 0xff, 0xff, 0xff]);
        assert!(reader.next_frame().is_err());
        for _ in 0..64 {
            reader.push(&[0; 1 << 16]);
        }
        assert!(reader.buffer.is_empty());
        assert!(matches!(reader.next_frame(), Err(DecodeError::TooLong(_))));
    }
}

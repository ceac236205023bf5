//! A scan for the fields of [`json_fields_until`](super::json_fields_until) over the common
//! shape of webhook JSON, answering only when its answer is certain to be serde_json's.
//!
//! Why hand-written: at 1 KiB the serde_json scan (a `Deserializer` driving a visitor with
//! `IgnoredAny` for the members passed over) is about half of a Stripe verification's cost
//! outside the HMAC, for reading one short string; most of it is the per-member machinery of the
//! serde data model, not the bytes (`scripts/verify-instructions.sh` counts it per provider).
//! `jiter` (the iterator-style parser of pydantic), the crate alternative, saves too little of
//! that for ten more crates.
//!
//! serde_json stays the authority: this scan understands a strict subset of JSON (keys and the
//! values it reads without escapes, integers it reads without sign, fraction or exponent,
//! bounded nesting) and gives up ([`Unsure`]) on anything else, after which the caller runs
//! the serde_json scan from the start. Where it answers, it accepts no input that serde_json
//! rejects and reads the same values; a differential property test and a fuzz target
//! (`json_fields`) check exactly that.

use super::{
    json_seed::{bits, record, Path},
    Scalar,
};

/// The scan met something outside its subset: ask serde_json.
pub(super) struct Unsure;

type Step<T> = Result<T, Unsure>;

/// Deepest nesting passed over (serde_json allows 128; deeper documents go to it). At most
/// 64: the skip keeps the open containers in a `u64`.
const MAX_NESTING: usize = 64;

/// The bytes that end a plain run inside a JSON string: the quote, the backslash and the
/// control characters (which JSON forbids unescaped).
static STRING_SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Reads the fields like the serde_json scan, or returns [`Unsure`] (with `out` possibly
/// partly filled: the caller discards it).
pub(super) fn scan(
    body: &[u8],
    paths: &[Path<'_>],
    out: &mut [Option<Scalar>],
    done: &dyn Fn(&[Option<Scalar>]) -> bool,
) -> Result<(), Unsure> {
    let mut scanner = Scanner {
        body,
        pos: 0,
        paths,
        out,
        done,
    };
    scanner.whitespace();
    if scanner.peek() != Some(b'{') {
        // serde_json's scan accepts any document; the providers' bodies are objects.
        return Err(Unsure);
    }
    let all = u32::MAX >> (32 - paths.len());
    if scanner.read_value(0, all)? == Flow::Stop {
        return Ok(());
    }
    scanner.whitespace();
    if scanner.pos == body.len() {
        Ok(())
    } else {
        Err(Unsure)
    }
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    /// Everything needed is read; the rest of the body is not looked at.
    Stop,
}

struct Scanner<'b, 's, 'p> {
    body: &'b [u8],
    pos: usize,
    paths: &'s [Path<'p>],
    out: &'s mut [Option<Scalar>],
    done: &'s dyn Fn(&[Option<Scalar>]) -> bool,
}

impl<'b> Scanner<'b, '_, '_> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.pos).copied()
    }

    fn next(&mut self) -> Step<u8> {
        let byte = self.peek().ok_or(Unsure)?;
        self.pos += 1;
        Ok(byte)
    }

    fn expect(&mut self, byte: u8) -> Step<()> {
        if self.next()? == byte {
            Ok(())
        } else {
            Err(Unsure)
        }
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// A value at a position some paths lead to (`candidates`, after `depth` segments): read,
    /// recorded where a path ends, descended into where paths go on.
    fn read_value(&mut self, depth: usize, candidates: u32) -> Step<Flow> {
        self.whitespace();
        match self.peek().ok_or(Unsure)? {
            b'{' => {
                record(self.paths, depth, candidates, self.out, || Scalar::Other);
                self.read_object(depth, candidates)
            }
            b'"' => {
                let text = self.plain_string()?;
                // `text` is UTF-8 (checked by `plain_string`): nothing is replaced.
                record(self.paths, depth, candidates, self.out, || {
                    Scalar::Str(String::from_utf8_lossy(text).into_owned())
                });
                Ok(Flow::Continue)
            }
            b'0'..=b'9' => {
                let number = self.plain_integer()?;
                record(self.paths, depth, candidates, self.out, || {
                    Scalar::U64(number)
                });
                Ok(Flow::Continue)
            }
            // Arrays hold no path's target (pointers are object keys only).
            b'[' | b't' | b'f' | b'n' => {
                self.skip_value(depth)?;
                record(self.paths, depth, candidates, self.out, || Scalar::Other);
                Ok(Flow::Continue)
            }
            // Negative numbers are rare in ids; serde_json reads them.
            _ => Err(Unsure),
        }
    }

    fn read_object(&mut self, depth: usize, candidates: u32) -> Step<Flow> {
        self.expect(b'{')?;
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Flow::Continue);
        }
        loop {
            self.whitespace();
            let key = self.plain_string()?;
            self.whitespace();
            self.expect(b':')?;
            let children = bits(candidates)
                .filter(|&i| {
                    let path = &self.paths[i];
                    path.len > depth && path.segments[depth].as_bytes() == key
                })
                .fold(0u32, |mask, i| mask | 1 << i);
            if children == 0 {
                self.skip_value(depth + 1)?;
            } else if self.read_value(depth + 1, children)? == Flow::Stop || (self.done)(self.out) {
                return Ok(Flow::Stop);
            }
            self.whitespace();
            match self.next()? {
                b',' => {}
                b'}' => return Ok(Flow::Continue),
                _ => return Err(Unsure),
            }
        }
    }

    /// A string without escapes or control characters whose bytes are UTF-8 (what serde_json
    /// requires of the strings it reads), without the quotes.
    fn plain_string(&mut self) -> Step<&'b [u8]> {
        self.expect(b'"')?;
        let rest = &self.body[self.pos..];
        let mut high = 0u8;
        let len = rest
            .iter()
            .position(|&b| {
                high |= b;
                STRING_SPECIAL[usize::from(b)]
            })
            .ok_or(Unsure)?;
        let text = &rest[..len];
        // ASCII is UTF-8, so `from_utf8`'s validation runs only for text with a byte above
        // 0x7f.
        if rest[len] != b'"' || (high >= 0x80 && std::str::from_utf8(text).is_err()) {
            return Err(Unsure);
        }
        self.pos += len + 1;
        Ok(text)
    }

    /// A non-negative integer without fraction or exponent that fits a `u64` (serde_json's
    /// `visit_u64`).
    fn plain_integer(&mut self) -> Step<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
                .ok_or(Unsure)?;
            self.pos += 1;
        }
        let leading_zero = self.body[start] == b'0' && self.pos - start > 1;
        if leading_zero || matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(Unsure);
        }
        Ok(value)
    }

    /// Passes over a value no path leads to, checking its syntax as serde_json's
    /// `IgnoredAny` does (string contents are not checked for UTF-8 there either).
    ///
    /// A loop over a bit stack of the open containers rather than recursion: this runs over
    /// every byte before the last wanted field (all of a large body when the id comes last).
    fn skip_value(&mut self, depth: usize) -> Step<()> {
        // Bit `i` set: the `i`-th open container is an object.
        let mut objects: u64 = 0;
        let mut open = 0usize;
        loop {
            // At the start of a value.
            self.whitespace();
            match self.next()? {
                b'"' => self.skip_string_rest()?,
                opener @ (b'{' | b'[') => {
                    let closer = if opener == b'{' { b'}' } else { b']' };
                    self.whitespace();
                    if self.peek() == Some(closer) {
                        self.pos += 1;
                    } else {
                        if depth + open >= MAX_NESTING {
                            return Err(Unsure);
                        }
                        objects = objects & !(1 << open) | u64::from(opener == b'{') << open;
                        open += 1;
                        if opener == b'{' {
                            self.skip_key()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"rue")?,
                b'f' => self.literal(b"alse")?,
                b'n' => self.literal(b"ull")?,
                b'-' => self.skip_number_rest(self.pos)?,
                b'0'..=b'9' => self.skip_number_rest(self.pos - 1)?,
                _ => return Err(Unsure),
            }
            // After a value: close what it completes, or go on to the next member.
            loop {
                if open == 0 {
                    return Ok(());
                }
                let in_object = objects >> (open - 1) & 1 == 1;
                self.whitespace();
                match (self.next()?, in_object) {
                    (b',', true) => {
                        self.skip_key()?;
                        break;
                    }
                    (b',', false) => break,
                    (b'}', true) | (b']', false) => open -= 1,
                    _ => return Err(Unsure),
                }
            }
        }
    }

    /// `"key" :` inside a skipped object.
    fn skip_key(&mut self) -> Step<()> {
        self.whitespace();
        self.expect(b'"')?;
        self.skip_string_rest()?;
        self.whitespace();
        self.expect(b':')
    }

    fn literal(&mut self, rest: &[u8]) -> Step<()> {
        if self.body[self.pos..].starts_with(rest) {
            self.pos += rest.len();
            Ok(())
        } else {
            Err(Unsure)
        }
    }

    /// After the opening quote.
    fn skip_string_rest(&mut self) -> Step<()> {
        loop {
            let rest = &self.body[self.pos..];
            let run = rest
                .iter()
                .position(|&b| STRING_SPECIAL[usize::from(b)])
                .ok_or(Unsure)?;
            self.pos += run + 1;
            match rest[run] {
                b'"' => return Ok(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    b'u' => {
                        for _ in 0..4 {
                            if !self.next()?.is_ascii_hexdigit() {
                                return Err(Unsure);
                            }
                        }
                    }
                    _ => return Err(Unsure),
                },
                _ => return Err(Unsure),
            }
        }
    }

    /// `int frac? exp?` of the JSON grammar, `int` starting at `start` (after any minus).
    fn skip_number_rest(&mut self, start: usize) -> Step<()> {
        self.pos = start;
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return Err(Unsure),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.one_or_more_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
        }
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Step<()> {
        let start = self.pos;
        self.digits();
        if self.pos == start {
            Err(Unsure)
        } else {
            Ok(())
        }
    }
}

//! The messages of pprof's `profile.proto` and a hand-written encoder and
//! decoder for them (protobuf wire format, proto3 semantics: zero scalars are
//! omitted, repeated scalars are packed). No code generation: protoc is not
//! available where allocprof is built, and the schema is small and frozen.
//!
//! Field numbers follow
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>.

use thiserror::Error;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    pub sample_type: Vec<ValueType>,
    pub sample: Vec<Sample>,
    pub mapping: Vec<Mapping>,
    pub location: Vec<Location>,
    pub function: Vec<Function>,
    /// Index 0 must be "".
    pub string_table: Vec<String>,
    pub drop_frames: i64,
    pub keep_frames: i64,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period_type: Option<ValueType>,
    pub period: i64,
    pub comment: Vec<i64>,
    pub default_sample_type: i64,
}

/// Strings are indices into `string_table`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ValueType {
    pub r#type: i64,
    pub unit: i64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Innermost first.
    pub location_id: Vec<u64>,
    /// One per `sample_type`.
    pub value: Vec<i64>,
    pub label: Vec<Label>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Label {
    pub key: i64,
    /// A string value, or 0 for a numeric label.
    pub str: i64,
    pub num: i64,
    pub num_unit: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub id: u64,
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: i64,
    pub build_id: i64,
    pub has_functions: bool,
    pub has_filenames: bool,
    pub has_line_numbers: bool,
    pub has_inline_frames: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub id: u64,
    pub mapping_id: u64,
    pub address: u64,
    /// Innermost first: all but the last were inlined into the last.
    pub line: Vec<Line>,
    pub is_folded: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Line {
    pub function_id: u64,
    pub line: i64,
    pub column: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Function {
    pub id: u64,
    pub name: i64,
    pub system_name: i64,
    pub filename: i64,
    pub start_line: i64,
}

/// Why bytes are not a well-formed protobuf message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated protobuf at byte {0}")]
    Truncated(usize),
    #[error("malformed varint at byte {0}")]
    Varint(usize),
    #[error("unsupported protobuf wire type {wire} at byte {at}")]
    WireType { wire: u8, at: usize },
    #[error("field {field} has the wrong wire type at byte {at}")]
    FieldType { field: u32, at: usize },
    #[error("string is not utf-8 at byte {0}")]
    Utf8(usize),
}

// ---------------------------------------------------------------- encoding

impl Profile {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        for t in &self.sample_type {
            w.message(1, |w| t.encode(w));
        }
        for s in &self.sample {
            w.message(2, |w| s.encode(w));
        }
        for m in &self.mapping {
            w.message(3, |w| m.encode(w));
        }
        for l in &self.location {
            w.message(4, |w| l.encode(w));
        }
        for f in &self.function {
            w.message(5, |w| f.encode(w));
        }
        // Every entry, empty ones included: indices must stay aligned.
        for s in &self.string_table {
            w.bytes(6, s.as_bytes());
        }
        w.int(7, self.drop_frames);
        w.int(8, self.keep_frames);
        w.int(9, self.time_nanos);
        w.int(10, self.duration_nanos);
        if let Some(t) = &self.period_type {
            w.message(11, |w| t.encode(w));
        }
        w.int(12, self.period);
        w.packed(13, self.comment.iter().map(|&c| c as u64));
        w.int(14, self.default_sample_type);
        w.buf
    }

    pub fn decode(data: &[u8]) -> Result<Profile, WireError> {
        let mut p = Profile::default();
        let mut r = Reader::new(data, 0);
        while let Some((field, value)) = r.next()? {
            match field {
                1 => p
                    .sample_type
                    .push(ValueType::decode(value.message(field)?)?),
                2 => p.sample.push(Sample::decode(value.message(field)?)?),
                3 => p.mapping.push(Mapping::decode(value.message(field)?)?),
                4 => p.location.push(Location::decode(value.message(field)?)?),
                5 => p.function.push(Function::decode(value.message(field)?)?),
                6 => p.string_table.push(value.string(field)?),
                7 => p.drop_frames = value.int(field)?,
                8 => p.keep_frames = value.int(field)?,
                9 => p.time_nanos = value.int(field)?,
                10 => p.duration_nanos = value.int(field)?,
                11 => p.period_type = Some(ValueType::decode(value.message(field)?)?),
                12 => p.period = value.int(field)?,
                13 => value.repeated(field, |v| p.comment.push(v as i64))?,
                14 => p.default_sample_type = value.int(field)?,
                _ => {} // unknown fields are skipped, as protobuf requires
            }
        }
        Ok(p)
    }
}

impl ValueType {
    fn encode(&self, w: &mut Writer) {
        w.int(1, self.r#type);
        w.int(2, self.unit);
    }

    fn decode(mut r: Reader<'_>) -> Result<ValueType, WireError> {
        let mut t = ValueType::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => t.r#type = value.int(field)?,
                2 => t.unit = value.int(field)?,
                _ => {}
            }
        }
        Ok(t)
    }
}

impl Sample {
    fn encode(&self, w: &mut Writer) {
        w.packed(1, self.location_id.iter().copied());
        w.packed(2, self.value.iter().map(|&v| v as u64));
        for l in &self.label {
            w.message(3, |w| l.encode(w));
        }
    }

    fn decode(mut r: Reader<'_>) -> Result<Sample, WireError> {
        let mut s = Sample::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => value.repeated(field, |v| s.location_id.push(v))?,
                2 => value.repeated(field, |v| s.value.push(v as i64))?,
                3 => s.label.push(Label::decode(value.message(field)?)?),
                _ => {}
            }
        }
        Ok(s)
    }
}

impl Label {
    fn encode(&self, w: &mut Writer) {
        w.int(1, self.key);
        w.int(2, self.str);
        w.int(3, self.num);
        w.int(4, self.num_unit);
    }

    fn decode(mut r: Reader<'_>) -> Result<Label, WireError> {
        let mut l = Label::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => l.key = value.int(field)?,
                2 => l.str = value.int(field)?,
                3 => l.num = value.int(field)?,
                4 => l.num_unit = value.int(field)?,
                _ => {}
            }
        }
        Ok(l)
    }
}

impl Mapping {
    fn encode(&self, w: &mut Writer) {
        w.uint(1, self.id);
        w.uint(2, self.memory_start);
        w.uint(3, self.memory_limit);
        w.uint(4, self.file_offset);
        w.int(5, self.filename);
        w.int(6, self.build_id);
        w.uint(7, self.has_functions.into());
        w.uint(8, self.has_filenames.into());
        w.uint(9, self.has_line_numbers.into());
        w.uint(10, self.has_inline_frames.into());
    }

    fn decode(mut r: Reader<'_>) -> Result<Mapping, WireError> {
        let mut m = Mapping::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => m.id = value.uint(field)?,
                2 => m.memory_start = value.uint(field)?,
                3 => m.memory_limit = value.uint(field)?,
                4 => m.file_offset = value.uint(field)?,
                5 => m.filename = value.int(field)?,
                6 => m.build_id = value.int(field)?,
                7 => m.has_functions = value.uint(field)? != 0,
                8 => m.has_filenames = value.uint(field)? != 0,
                9 => m.has_line_numbers = value.uint(field)? != 0,
                10 => m.has_inline_frames = value.uint(field)? != 0,
                _ => {}
            }
        }
        Ok(m)
    }
}

impl Location {
    fn encode(&self, w: &mut Writer) {
        w.uint(1, self.id);
        w.uint(2, self.mapping_id);
        w.uint(3, self.address);
        for l in &self.line {
            w.message(4, |w| l.encode(w));
        }
        w.uint(5, self.is_folded.into());
    }

    fn decode(mut r: Reader<'_>) -> Result<Location, WireError> {
        let mut l = Location::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => l.id = value.uint(field)?,
                2 => l.mapping_id = value.uint(field)?,
                3 => l.address = value.uint(field)?,
                4 => l.line.push(Line::decode(value.message(field)?)?),
                5 => l.is_folded = value.uint(field)? != 0,
                _ => {}
            }
        }
        Ok(l)
    }
}

impl Line {
    fn encode(&self, w: &mut Writer) {
        w.uint(1, self.function_id);
        w.int(2, self.line);
        w.int(3, self.column);
    }

    fn decode(mut r: Reader<'_>) -> Result<Line, WireError> {
        let mut l = Line::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => l.function_id = value.uint(field)?,
                2 => l.line = value.int(field)?,
                3 => l.column = value.int(field)?,
                _ => {}
            }
        }
        Ok(l)
    }
}

impl Function {
    fn encode(&self, w: &mut Writer) {
        w.uint(1, self.id);
        w.int(2, self.name);
        w.int(3, self.system_name);
        w.int(4, self.filename);
        w.int(5, self.start_line);
    }

    fn decode(mut r: Reader<'_>) -> Result<Function, WireError> {
        let mut f = Function::default();
        while let Some((field, value)) = r.next()? {
            match field {
                1 => f.id = value.uint(field)?,
                2 => f.name = value.int(field)?,
                3 => f.system_name = value.int(field)?,
                4 => f.filename = value.int(field)?,
                5 => f.start_line = value.int(field)?,
                _ => {}
            }
        }
        Ok(f)
    }
}

// ------------------------------------------------------------- wire format

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    /// proto3: a zero scalar is not written.
    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, VARINT);
            self.varint(v);
        }
    }

    /// `int64` is a plain varint of the two's complement (not zigzag).
    fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, LEN);
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn packed(&mut self, field: u32, values: impl Iterator<Item = u64>) {
        let mut inner = Writer::default();
        for v in values {
            inner.varint(v);
        }
        if !inner.buf.is_empty() {
            self.bytes(field, &inner.buf);
        }
    }

    fn message(&mut self, field: u32, body: impl FnOnce(&mut Writer)) {
        let mut inner = Writer::default();
        body(&mut inner);
        self.bytes(field, &inner.buf);
    }
}

/// A field's value as the wire has it.
enum Value<'a> {
    Varint(u64),
    Fixed(u64),
    /// The bytes and where they start in the whole input (for errors).
    Len(&'a [u8], usize),
}

impl<'a> Value<'a> {
    fn uint(&self, field: u32) -> Result<u64, WireError> {
        match self {
            Value::Varint(v) | Value::Fixed(v) => Ok(*v),
            Value::Len(_, at) => Err(WireError::FieldType { field, at: *at }),
        }
    }

    fn int(&self, field: u32) -> Result<i64, WireError> {
        self.uint(field).map(|v| v as i64)
    }

    fn message(&self, field: u32) -> Result<Reader<'a>, WireError> {
        match self {
            Value::Len(b, at) => Ok(Reader::new(b, *at)),
            _ => Err(WireError::FieldType { field, at: 0 }),
        }
    }

    fn string(&self, field: u32) -> Result<String, WireError> {
        match self {
            Value::Len(b, at) => std::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|_| WireError::Utf8(*at)),
            _ => Err(WireError::FieldType { field, at: 0 }),
        }
    }

    /// A repeated scalar: packed (what proto3 writers emit) or one element.
    fn repeated(&self, field: u32, mut push: impl FnMut(u64)) -> Result<(), WireError> {
        match self {
            Value::Len(b, at) => {
                let mut r = Reader::new(b, *at);
                while !r.at_end() {
                    push(r.varint()?);
                }
                Ok(())
            }
            v => {
                push(v.uint(field)?);
                Ok(())
            }
        }
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of `data` in the whole input, for error messages.
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], base: usize) -> Reader<'a> {
        Reader { data, pos: 0, base }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn here(&self) -> usize {
        self.base + self.pos
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let start = self.here();
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.data.get(self.pos) else {
                return Err(WireError::Truncated(start));
            };
            self.pos += 1;
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && b > 1 {
                return Err(WireError::Varint(start));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Varint(start))
    }

    fn take(&mut self, n: u64) -> Result<(&'a [u8], usize), WireError> {
        let at = self.here();
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.data.len())
            .ok_or(WireError::Truncated(at))?;
        let slice = &self.data[self.pos..end];
        self.pos = end;
        Ok((slice, at))
    }

    fn next(&mut self) -> Result<Option<(u32, Value<'a>)>, WireError> {
        if self.at_end() {
            return Ok(None);
        }
        let at = self.here();
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| WireError::Varint(at))?;
        let value = match (key & 7) as u8 {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => {
                let (b, _) = self.take(8)?;
                Value::Fixed(u64::from_le_bytes(b.try_into().expect("8 bytes")))
            }
            LEN => {
                let n = self.varint()?;
                let (b, at) = self.take(n)?;
                Value::Len(b, at)
            }
            FIXED32 => {
                let (b, _) = self.take(4)?;
                Value::Fixed(u64::from(u32::from_le_bytes(
                    b.try_into().expect("4 bytes"),
                )))
            }
            wire => return Err(WireError::WireType { wire, at }),
        };
        Ok(Some((field, value)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample_profile() -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample {
                location_id: vec![1, 2, u64::MAX],
                value: vec![-1, 0, i64::MAX, i64::MIN],
                label: vec![Label {
                    key: 3,
                    str: 0,
                    num: 1234,
                    num_unit: 0,
                }],
            }],
            mapping: vec![Mapping {
                id: 1,
                filename: 4,
                build_id: 5,
                has_functions: true,
                has_line_numbers: true,
                ..Default::default()
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 1,
                address: 0x1234,
                line: vec![
                    Line {
                        function_id: 1,
                        line: 10,
                        column: 0,
                    },
                    Line {
                        function_id: 2,
                        line: 0,
                        column: 3,
                    },
                ],
                is_folded: false,
            }],
            function: vec![Function {
                id: 1,
                name: 1,
                system_name: 1,
                filename: 2,
                start_line: 0,
            }],
            string_table: ["", "a", "", "ünïcode", "x"].map(String::from).to_vec(),
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 5,
            period_type: Some(ValueType { r#type: 1, unit: 0 }),
            period: 524_288,
            comment: vec![3, 4],
            default_sample_type: 1,
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let p = sample_profile();
        assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn known_bytes() {
        // ValueType{type: 1, unit: 2} as field 1, then string "" and "ab".
        let p = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: vec![String::new(), "ab".into()],
            ..Default::default()
        };
        assert_eq!(
            p.encode(),
            [0x0a, 4, 0x08, 1, 0x10, 2, 0x32, 0, 0x32, 2, b'a', b'b']
        );
        // A negative int64 takes ten bytes.
        let mut w = Writer::default();
        w.int(1, -1);
        assert_eq!(w.buf.len(), 11);
    }

    #[test]
    fn unpacked_repeated_and_unknown_fields_are_accepted() {
        // Sample with location_id 7 and 8 unpacked, and an unknown fixed32
        // and fixed64 field.
        let sample = [
            0x08, 7, 0x08, 8, 0x7d, 1, 2, 3, 4, 0x79, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut bytes = vec![0x12, sample.len() as u8];
        bytes.extend_from_slice(&sample);
        let p = Profile::decode(&bytes).unwrap();
        assert_eq!(p.sample[0].location_id, [7, 8]);
    }

    #[test]
    fn malformed_input_is_an_error() {
        let good = sample_profile().encode();
        for cut in 1..good.len() {
            // Every strict prefix either fails or decodes to something
            // smaller: never a panic.
            let _ = Profile::decode(&good[..cut]);
        }
        assert_eq!(Profile::decode(&[0x0a, 5, 1]), Err(WireError::Truncated(2)));
        assert!(matches!(
            Profile::decode(&[0x0b]),
            Err(WireError::WireType { wire: 3, .. })
        ));
        assert!(matches!(
            Profile::decode(&[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
            ]),
            Err(WireError::Varint(1))
        ));
        assert!(matches!(
            Profile::decode(&[0x32, 1, 0xff]),
            Err(WireError::Utf8(2))
        ));
        // A message where a scalar is expected.
        assert!(matches!(
            Profile::decode(&[0x60, 1, 0x0a, 1, 0x08]),
            Err(WireError::Truncated(_))
        ));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Profile::decode(&bytes);
        }

        #[test]
        fn samples_round_trip(
            locations in proptest::collection::vec(any::<u64>(), 0..20),
            values in proptest::collection::vec(any::<i64>(), 0..8),
            strings in proptest::collection::vec(".*", 0..8),
        ) {
            let mut string_table = vec![String::new()];
            string_table.extend(strings);
            let p = Profile {
                sample: vec![Sample { location_id: locations, value: values, label: vec![] }],
                string_table,
                ..Default::default()
            };
            prop_assert_eq!(Profile::decode(&p.encode()).unwrap(), p);
        }
    }
}

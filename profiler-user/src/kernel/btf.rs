//! Where a field lies in a kernel structure, read from the kernel's own type
//! information (`/sys/kernel/btf/vmlinux`). The kernel programs are built
//! without CO-RE relocations (aya-ebpf cannot emit them), so a program that
//! reads a kernel structure is given the field's offset at load time.

use std::collections::HashMap;

/// The kernel's BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// More than any kernel's BTF (6.18's is 5.5 MB): a larger file is refused.
const MAX_BTF: u64 = 64 << 20;

/// Anonymous structs and unions followed into, at most.
const MAX_NESTING: usize = 8;

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// The byte offset of `member` in `struct name` of the running kernel.
pub fn kernel_member_offset(name: &str, member: &str) -> Result<u32, String> {
    use std::io::Read;
    let file = std::fs::File::open(VMLINUX).map_err(|e| format!("{VMLINUX}: {e}"))?;
    let mut data = Vec::new();
    file.take(MAX_BTF)
        .read_to_end(&mut data)
        .map_err(|e| format!("{VMLINUX}: {e}"))?;
    member_offset(&data, name, member)
        .ok_or_else(|| format!("{VMLINUX} has no member {member} in struct {name}"))
}

/// The byte offset of `member` in the struct `name` described by the BTF
/// blob `data`, looking into anonymous structs and unions (`None`: no such
/// struct or member, a bit field, or malformed BTF).
pub fn member_offset(data: &[u8], name: &str, member: &str) -> Option<u32> {
    let btf = Btf::parse(data)?;
    let id = btf.struct_named(name)?;
    btf.find_member(id, member, 0)
}

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Each type's offset in `types`, by id (id 0 is `void`).
    offsets: Vec<usize>,
}

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    /// The size or type field.
    size_or_type: u32,
    /// Where its kind-specific data starts in `types`.
    extra: usize,
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        data.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Option<Btf<'a>> {
        if u16_at(data, 0)? != MAGIC {
            return None; // not BTF, or big-endian
        }
        let hdr_len = u32_at(data, 4)? as usize;
        // (offset, length) of a section, after the header.
        let section = |off: usize| {
            let start = hdr_len.checked_add(u32_at(data, off)? as usize)?;
            data.get(start..start.checked_add(u32_at(data, off + 4)? as usize)?)
        };
        let (types, strings) = (section(8)?, section(16)?);
        let mut btf = Btf {
            types,
            strings,
            offsets: vec![0],
        };
        let mut at = 0;
        while at < types.len() {
            let t = btf.type_at(at)?;
            btf.offsets.push(at);
            at = t.extra.checked_add(extra_len(&t)?)?;
        }
        Some(btf)
    }

    fn type_at(&self, at: usize) -> Option<Type> {
        let info = u32_at(self.types, at + 4)?;
        Some(Type {
            name_off: u32_at(self.types, at)?,
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 != 0,
            vlen: (info & 0xffff) as usize,
            size_or_type: u32_at(self.types, at + 8)?,
            extra: at + 12,
        })
    }

    fn by_id(&self, id: u32) -> Option<Type> {
        self.type_at(*self.offsets.get(id as usize).filter(|_| id != 0)?)
    }

    fn name(&self, off: u32) -> Option<&'a [u8]> {
        let rest = self.strings.get(off as usize..)?;
        Some(&rest[..rest.iter().position(|&b| b == 0)?])
    }

    fn struct_named(&self, name: &str) -> Option<u32> {
        (1..self.offsets.len() as u32).find(|&id| {
            self.by_id(id).is_some_and(|t| {
                t.kind == KIND_STRUCT && self.name(t.name_off) == Some(name.as_bytes())
            })
        })
    }

    /// Skips typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<Type> {
        let mut seen = HashMap::new();
        loop {
            let t = self.by_id(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    if seen.insert(id, ()).is_some() {
                        return None; // a cycle: malformed
                    }
                    id = t.size_or_type;
                }
                _ => return Some(t),
            }
        }
    }

    fn find_member(&self, id: u32, member: &str, depth: usize) -> Option<u32> {
        let t = self.resolve(id)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > MAX_NESTING {
            return None;
        }
        for i in 0..t.vlen {
            let at = t.extra + 12 * i;
            let (name_off, ty, offset) = (
                u32_at(self.types, at)?,
                u32_at(self.types, at + 4)?,
                u32_at(self.types, at + 8)?,
            );
            // With the kind flag, the low 24 bits are the offset and the
            // high 8 a bit field's size.
            let bits = if t.kind_flag {
                offset & 0xff_ffff
            } else {
                offset
            };
            let bitfield = t.kind_flag && offset >> 24 != 0;
            let name = self.name(name_off)?;
            if name == member.as_bytes() {
                return (bits % 8 == 0 && !bitfield).then_some(bits / 8);
            }
            if name.is_empty()
                && bits % 8 == 0
                && let Some(inner) = self.find_member(ty, member, depth + 1)
            {
                return Some(bits / 8 + inner);
            }
        }
        None
    }
}

/// The length of a type's kind-specific data.
fn extra_len(t: &Type) -> Option<usize> {
    Some(match t.kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * t.vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * t.vlen,
        0..=19 => 0,
        _ => return None, // a kind this parser does not know: sizes unknown
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `int`, then `struct task { int a; union { int x; int
    /// tgid; }; int b:3; }` with the union at byte 8 and `b` a bit field.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0task\0a\0x\0tgid\0b\0";
        let name = |s: &str| {
            let at = strings
                .windows(s.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=s.len()] == s.as_bytes() && w[s.len() + 1] == 0)
                .unwrap();
            at as u32 + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // [1] int: name, info (kind 1), size 4, encoding.
        push(&[name("int"), KIND_INT << 24, 4, 32]);
        // [2] union { int x; int tgid; }
        push(&[0, KIND_UNION << 24 | 2, 4]);
        push(&[name("x"), 1, 0, name("tgid"), 1, 0]);
        // [3] typedef of the union (an anonymous member may name one).
        push(&[0, KIND_TYPEDEF << 24, 2]);
        // [4] struct task, with the kind flag (bit field offsets).
        push(&[name("task"), 1 << 31 | KIND_STRUCT << 24 | 3, 16]);
        push(&[name("a"), 1, 0, 0, 3, 64, name("b"), 1, 3 << 24 | 96]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        for w in [
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn finds_members_also_inside_anonymous_unions() {
        let data = blob();
        assert_eq!(member_offset(&data, "task", "a"), Some(0));
        assert_eq!(member_offset(&data, "task", "tgid"), Some(8));
        assert_eq!(member_offset(&data, "task", "b"), None, "a bit field");
        assert_eq!(member_offset(&data, "task", "nope"), None);
        assert_eq!(member_offset(&data, "int", "a"), None);
    }

    #[test]
    fn malformed_btf_finds_nothing() {
        let data = blob();
        for cut in 0..data.len() {
            // Any prefix either parses to the same answer or to none.
            let got = member_offset(&data[..cut], "task", "tgid");
            assert!(got.is_none() || got == Some(8), "{cut}: {got:?}");
        }
        let mut bad = data;
        bad[0] = 0;
        assert_eq!(member_offset(&bad, "task", "tgid"), None);
    }
}

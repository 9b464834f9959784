//! How the kernel reads a USDT probe's arguments: the note's argument string
//! (`-8@%rdi`, `8@-16(%rbp)`, `4@$5`) compiled by user space into a
//! description the kernel program evaluates against `struct pt_regs`.

/// Arguments the kernel reads per probe (`alloc(ptr, size, weight)` has three).
pub const MAX_USDT_ARGS: usize = 3;

#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UsdtArgKind {
    /// Argument absent: reads as 0.
    #[default]
    None = 0,
    /// `$imm`: the constant in `value`.
    Const = 1,
    /// `%reg`: the register at `reg_offset` in `pt_regs`.
    Reg = 2,
    /// `disp(%reg)`: user memory at register + `value`.
    RegDeref = 3,
}

/// One argument. `size` is in bytes (1, 2, 4, 8); `signed` selects sign
/// extension of narrower values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArg {
    pub value: i64,
    pub reg_offset: u16,
    pub kind: u8,
    pub size: u8,
    pub signed: u8,
    pub _pad: [u8; 3],
}

impl UsdtArg {
    /// Truncates a raw 64-bit read to the argument's width and extends it
    /// back. Shifts rather than a match: fewer branches for the verifier.
    #[inline(always)]
    pub fn normalize(&self, raw: u64) -> u64 {
        let size = if self.size >= 1 && self.size <= 8 {
            u32::from(self.size)
        } else {
            8
        };
        let shift = 64 - 8 * size;
        if self.signed != 0 {
            ((raw << shift) as i64 >> shift) as u64
        } else {
            (raw << shift) >> shift
        }
    }
}

/// The argument description of one attached probe site, found in the kernel
/// through the uprobe's attach cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    pub args: [UsdtArg; MAX_USDT_ARGS],
    pub arg_count: u32,
    /// The probe's provider as a bit of `ProcCounters::contracts`
    /// ([`crate::CONTRACT_OTEL_MEMORY`], [`crate::CONTRACT_DDHEAP`]): the kernel
    /// records which contracts each process spoke.
    pub provider: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<UsdtArg>(), 16);
        assert_eq!(size_of::<UsdtSpec>(), 16 * MAX_USDT_ARGS + 8);
    }

    #[test]
    fn normalize_truncates_and_sign_extends() {
        let arg = |size, signed| UsdtArg {
            size,
            signed,
            ..Default::default()
        };
        assert_eq!(arg(4, 1).normalize(0xffff_ffff), u64::MAX);
        assert_eq!(arg(4, 0).normalize(0x1_ffff_ffff), 0xffff_ffff);
        assert_eq!(arg(1, 1).normalize(0x80), (-128i64) as u64);
        assert_eq!(arg(8, 0).normalize(u64::MAX), u64::MAX);
    }
}

//! GPU device rules on cgroup v2: a small BPF program of the
//! `BPF_PROG_TYPE_CGROUP_DEVICE` type, attached to an attempt's cgroup,
//! refuses the character devices of the node's other GPUs, as cgroup v1's
//! `devices.deny` does. The kernel runs it on every open or mknod of a
//! device node by a process of the cgroup (or of a cgroup below it).
//!
//! It is attached with `BPF_F_ALLOW_MULTI`, so the programs of the cgroups
//! above (systemd's `DevicePolicy`, a container runtime's) still run and
//! every one of them must allow an access: the attempt never gets more
//! than the agent had. The program lives as long as the cgroup it is
//! attached to.
//!
//! The program is a list of comparisons, assembled here rather than
//! compiled, as Slurm's and runc's are: read the device's type, major and
//! minor from the context, and answer 0 (refuse) for a denied character
//! device, 1 for everything else.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One BPF instruction, as the kernel reads it (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    /// dst_reg in the low 4 bits, src_reg in the high 4.
    regs: u8,
    off: i16,
    imm: i32,
}

// Opcodes of linux/bpf.h (class | size or op | source).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// `BPF_DEVCG_DEV_CHAR`: the device type of a character device.
const DEV_CHAR: i32 = 2;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// The program that refuses the character devices `deny` (major, minor)
/// and allows everything else. Its context is `struct bpf_cgroup_dev_ctx`:
/// `access_type` (the type in its low 16 bits), `major`, `minor`, each a
/// u32 at offsets 0, 4 and 8.
pub fn program(deny: &[(u32, u32)]) -> Vec<Insn> {
    // r1: the context; r2: the device type; r3: its major; r4: its minor.
    // For each denied device: if major differs, skip its minor test; if the
    // minor matches, jump to the refusal. The answers come last:
    //   allow: r0 = 1; exit        deny: r0 = 0; exit
    let mut body = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU32_AND_K, 2, 0, 0, 0xffff),
        // Patched below: to `allow` for anything but a character device.
        insn(JNE_K, 2, 0, 0, DEV_CHAR),
        insn(LDX_MEM_W, 3, 1, 4, 0),
        insn(LDX_MEM_W, 4, 1, 8, 0),
    ];
    let mut to_deny = Vec::new();
    for &(major, minor) in deny {
        body.push(insn(JNE_K, 3, 0, 1, major as i32));
        to_deny.push(body.len());
        body.push(insn(JEQ_K, 4, 0, 0, minor as i32));
    }
    let allow = body.len();
    body.push(insn(MOV64_K, 0, 0, 0, 1));
    body.push(insn(EXIT, 0, 0, 0, 0));
    let deny_at = body.len();
    body.push(insn(MOV64_K, 0, 0, 0, 0));
    body.push(insn(EXIT, 0, 0, 0, 0));
    // A jump's offset counts from the instruction after it.
    body[2].off = (allow - 3) as i16;
    for at in to_deny {
        body[at].off = (deny_at - at - 1) as i16;
    }
    body
}

// Commands, types and flags of linux/bpf.h.
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// The leading fields of `union bpf_attr` for BPF_PROG_LOAD; the kernel
/// takes a shorter attr as if the rest were zero.
#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
}

/// The leading fields of `union bpf_attr` for BPF_PROG_ATTACH.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: attr is a live, initialised repr(C) struct of the layout the
    // command takes, and its size is passed with it.
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut T, std::mem::size_of::<T>()) };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Loads the program that refuses `deny` and attaches it to the cgroup
/// `dir` (needs root). The error says which step failed and, for a
/// program the kernel's verifier refused, what it said.
pub fn attach(dir: &Path, deny: &[(u32, u32)]) -> Result<(), String> {
    let program = program(deny);
    let license = c"GPL";
    let load = |log: &mut [u8]| {
        let mut attr = LoadAttr {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: program.len() as u32,
            insns: program.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            // No log: no buffer at all (the kernel refuses one without a level).
            log_buf: if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 },
            ..LoadAttr::default()
        };
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    // Without a log first: a verifier's log that fills its buffer fails
    // the load of a good program (ENOSPC). Only a refused program is
    // loaded again for the verifier's words.
    let prog = load(&mut []).map_err(|err| {
        let mut log = vec![0u8; 1 << 16];
        // SAFETY: a descriptor the kernel returned to us alone, closed here.
        drop(load(&mut log).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) }));
        let said = String::from_utf8_lossy(&log);
        let said = said.trim_end_matches('\0').trim();
        if said.is_empty() {
            format!("loading the GPU device filter: {err}")
        } else {
            format!("loading the GPU device filter: {err} ({said})")
        }
    })?;
    // SAFETY: the kernel just returned this new descriptor to us alone.
    let prog = unsafe { OwnedFd::from_raw_fd(prog as i32) };
    let cgroup = std::fs::File::open(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    let mut attach = AttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    bpf(BPF_PROG_ATTACH, &mut attach)
        .map_err(|err| format!("attaching the GPU device filter to {}: {err}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program over one access as the kernel would (only the
    /// instructions `program` emits), for the tests.
    fn run(program: &[Insn], (kind, major, minor): (u32, u32, u32)) -> u64 {
        let ctx = [kind | (0x7 << 16), major, minor];
        let mut regs = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let i = program[pc];
            let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1, "loads read the context");
                    regs[dst] = u64::from(ctx[i.off as usize / 4]);
                }
                ALU32_AND_K => regs[dst] = (regs[dst] as u32 & i.imm as u32) as u64,
                JNE_K if regs[dst] != i.imm as u32 as u64 => pc = (pc as i64 + i64::from(i.off)) as usize,
                JEQ_K if regs[dst] == i.imm as u32 as u64 => pc = (pc as i64 + i64::from(i.off)) as usize,
                JNE_K | JEQ_K => {}
                MOV64_K => regs[dst] = i.imm as u64,
                EXIT => return regs[0],
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn only_the_denied_character_devices_are_refused() {
        let program = program(&[(195, 1), (195, 3)]);
        assert_eq!(run(&program, (2, 195, 0)), 1, "its own GPU");
        assert_eq!(run(&program, (2, 195, 1)), 0, "another GPU");
        assert_eq!(run(&program, (2, 195, 3)), 0, "another GPU");
        assert_eq!(run(&program, (2, 195, 255)), 1, "nvidiactl");
        assert_eq!(run(&program, (2, 1, 3)), 1, "/dev/null");
        assert_eq!(run(&program, (2, 1, 1)), 1, "same minor, other major");
        assert_eq!(run(&program, (1, 195, 1)), 1, "a block device 195:1 is no GPU");
        assert_eq!(run(&super::program(&[]), (2, 195, 1)), 1, "nothing denied");
    }

    /// The kernel runs the program: a process of the cgroup opening a
    /// device node of a denied GPU gets EPERM, one of its own GPU gets past
    /// the filter (to the driver, or ENXIO where there is none). Needs root
    /// and a cgroup v2 hierarchy (alone, or beside v1 as on hybrid hosts).
    #[test]
    fn the_kernel_refuses_a_denied_gpu_to_the_processes_of_the_cgroup() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let Some(mount) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|m| m.join("cgroup.procs").exists() && !m.join("devices.allow").exists())
        else {
            eprintln!("skipped: no cgroup v2 hierarchy");
            return;
        };
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
        let cgroup = mount
            .join(own.trim_start_matches('/'))
            .join(format!("gpool-filter-test-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for minor in [0, 1] {
            nix::sys::stat::mknod(
                &dir.path().join(format!("nvidia{minor}")),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(195, minor),
            )
            .unwrap();
        }
        // Every other minor of a 64-GPU node: no verifier's log to fill.
        let others: Vec<(u32, u32)> = (1..64).map(|minor| (195, minor)).collect();
        if let Err(err) = attach(&cgroup, &others) {
            let _ = std::fs::remove_dir(&cgroup);
            // A sandbox that forbids bpf(2) to root (seccomp): the agent
            // then says so and labels the node cgroup-no-devices.
            if err.contains("Operation not permitted") || err.contains("Function not implemented") {
                eprintln!("skipped: this host refuses BPF programs: {err}");
                return;
            }
            panic!("{err}");
        }
        let procs = cgroup.join("cgroup.procs");
        let opened = |minor: u32| {
            let mut command = std::process::Command::new("sh");
            command
                .arg("-c")
                .arg(format!("exec 3< {}/nvidia{minor}", dir.path().display()));
            let procs = procs.clone();
            // SAFETY: between fork and exec only a write to a file.
            unsafe { command.pre_exec(move || std::fs::write(&procs, b"0")) };
            let output = command.output().unwrap();
            String::from_utf8_lossy(&output.stderr).to_string()
        };
        let (own_gpu, other_gpu) = (opened(0), opened(1));
        let _ = std::fs::remove_dir(&cgroup);
        assert!(!own_gpu.contains("not permitted"), "its own GPU: {own_gpu}");
        assert!(
            other_gpu.contains("Operation not permitted"),
            "another GPU: {other_gpu}"
        );
    }

    proptest::proptest! {
        #[test]
        fn a_device_is_refused_exactly_when_denied(
            deny in proptest::collection::vec((190u32..200, 0u32..8), 0..12),
            access in (1u32..3, 190u32..200, 0u32..8),
        ) {
            let refused = run(&program(&deny), access) == 0;
            let denied = access.0 == 2 && deny.contains(&(access.1, access.2));
            proptest::prop_assert_eq!(refused, denied);
        }
    }
}

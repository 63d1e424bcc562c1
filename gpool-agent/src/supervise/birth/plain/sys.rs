//! The child's system calls: raw, so that it touches neither libc nor
//! `errno`, and the clone whose child runs on a stack of its own.

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use super::super::{CloneArgs, Plan};
    use std::arch::asm;

    /// A system call of up to four arguments: its result, or -errno.
    #[inline(always)]
    pub(in super::super) fn call(number: nix::libc::c_long, args: [usize; 4]) -> isize {
        let result: isize;
        // SAFETY: the kernel reads only what the arguments point to; rcx
        // and r11 are the syscall instruction's own.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") number as isize => result,
                in("rdi") args[0],
                in("rsi") args[1],
                in("rdx") args[2],
                in("r10") args[3],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result
    }

    pub(in super::super) fn exit(code: i32) -> ! {
        loop {
            call(nix::libc::SYS_exit, [code as usize, 0, 0, 0]);
        }
    }

    /// `clone3` whose child calls `entry(plan)` on the stack `args` names:
    /// the child's pid (or -errno) in the caller.
    ///
    /// # Safety
    /// `args` must name a stack the child alone uses, and `plan` must stay
    /// valid until the child has exec'd or exited.
    pub(in super::super) unsafe fn clone3(
        args: &CloneArgs,
        entry: extern "C" fn(*const Plan) -> !,
        plan: &Plan,
    ) -> isize {
        let result: isize;
        // SAFETY: as the caller promises. In the child (rax 0) the kernel
        // has switched to the new stack; it calls `entry`, which never
        // returns, with a cleared frame pointer.
        unsafe {
            asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") nix::libc::SYS_clone3 as isize => result,
                in("rdi") args as *const CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") plan as *const Plan,
                in("r13") entry,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod other {
    use super::super::{CloneArgs, Plan};

    pub(in super::super) fn call(_: nix::libc::c_long, _: [usize; 4]) -> isize {
        -(nix::libc::ENOSYS as isize)
    }

    pub(in super::super) fn exit(code: i32) -> ! {
        // SAFETY: _exit(2) ends this process at once.
        unsafe { nix::libc::_exit(code) }
    }

    pub(in super::super) unsafe fn clone3(_: &CloneArgs, _: extern "C" fn(*const Plan) -> !, _: &Plan) -> isize {
        -(nix::libc::ENOSYS as isize)
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) use other::*;
#[cfg(target_arch = "x86_64")]
pub(super) use x86_64::*;

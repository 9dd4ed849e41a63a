// The static no-op the launch floor and the launch rows start: no libc, no dynamic loader, no
// startup code, just exit_group(0), so the measurement is the kernel's launch cost and nothing
// else. Built with -static -nostdlib -nostartfiles (bench/CMakeLists.txt); x86_64 and aarch64.
extern "C" [[noreturn]] void _start() {
#if defined(__x86_64__)
  asm volatile("mov $231, %eax\n\txor %edi, %edi\n\tsyscall");  // exit_group(0)
#elif defined(__aarch64__)
  asm volatile("mov x8, #94\n\tmov x0, #0\n\tsvc #0");  // exit_group(0)
#else
#error "custos_bench_noop: add the exit_group syscall for this architecture"
#endif
  __builtin_unreachable();
}

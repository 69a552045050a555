/* Minimal startup for RLX's Cortex-M test images under QEMU: the vector table, .data and .bss
 * set up, the FPU enabled, main() run, and its result reported to QEMU through semihosting
 * (which ends the emulation). Output goes through semihosting's SYS_WRITE0. */
#include <stdint.h>

extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
int main(void);

static inline int32_t rlx_semihost(int32_t op, const void *arg) {
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/* Print a NUL-terminated string on QEMU's standard output. */
void rlx_print(const char *s) { rlx_semihost(0x04, s); }

/* End the emulation: 0 is a normal exit (ADP_Stopped_ApplicationExit), anything else an
 * internal error, which QEMU reports with exit status 1. */
__attribute__((noreturn)) void rlx_exit(int code) {
    rlx_semihost(0x18, (const void *)(uintptr_t)(code == 0 ? 0x20026 : 0x20024));
    for (;;) {
    }
}

void Reset_Handler(void) {
    uint32_t *src = &_sidata, *dst = &_sdata;
    while (dst < &_edata) *dst++ = *src++;
    for (dst = &_sbss; dst < &_ebss;) *dst++ = 0;
#if defined(__ARM_FP)
    /* CPACR: full access to CP10 and CP11 (the FPU). */
    *(volatile uint32_t *)0xE000ED88 |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb");
#endif
    rlx_exit(main());
}

static void Fault_Handler(void) {
    rlx_print("rlx: fault\n");
    rlx_exit(1);
}

__attribute__((section(".isr_vector"), used)) const void *const rlx_vectors[16] = {
    &_estack,      Reset_Handler, Fault_Handler, Fault_Handler, Fault_Handler, Fault_Handler,
    Fault_Handler, 0,             0,             0,             0,             Fault_Handler,
    Fault_Handler, 0,             Fault_Handler, Fault_Handler,
};

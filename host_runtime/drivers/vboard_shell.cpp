// The virtual board's shell: the Verilator harness (sim/verilator/harness.cpp, included whole so
// its model, AXI4 memory and AXI4-Lite master are the rtl driver's, cycle for cycle) with a C API
// of single register accesses and a free-running clock, as a board's PS sees the core. Built by
// host_runtime/drivers/vboard.py and driven by its shell process (DRAM in shared memory).
#include "harness.cpp"

extern "C" {

// Attach the DRAM (the shared memory) and its timing: {read_latency, write_latency, bytes_per_cycle}.
void vb_attach(void* p, uint8_t* dram, uint64_t dram_bytes, uint32_t rl, uint32_t wl, uint32_t bpc) {
    Harness* h = static_cast<Harness*>(p);
    h->dram = dram;
    h->dram_bytes = dram_bytes;
    h->read_latency = rl;
    h->write_latency = wl;
    h->bytes_per_cycle = bpc;
}

// One AXI4-Lite write / read; 1 when the slave answered (within 64 cycles), 0 when stuck.
int vb_write(void* p, uint32_t addr, uint32_t data) { return static_cast<Harness*>(p)->axil_write(addr, data); }
int vb_read(void* p, uint32_t addr, uint32_t* out) { return static_cast<Harness*>(p)->axil_read(addr, out); }

// Clock up to max_cycles, stopping early when irq is high; returns irq.
int vb_tick(void* p, uint64_t max_cycles) {
    Harness* h = static_cast<Harness*>(p);
    for (uint64_t i = 0; i < max_cycles; i++) {
        if (h->top->irq) return 1;
        h->tick();
    }
    return h->top->irq ? 1 : 0;
}

uint64_t vb_cycle(void* p) { return static_cast<Harness*>(p)->cycle; }

}  // extern "C"

// The judge's own GPU kernels (cudal1.harness.timer, cudal1.harness.window).  The PTX that the
// judge loads is generated from this file into timer_kernels.ptx; regenerate it after any change:
//
//     python -m cudal1.harness.timer_ptx --write      (needs nvcc; checks the result with ptxas)
//
// The window protocol (docs/harness.md, "Timing"): a timed call's inputs reach the process that
// runs it masked with a per-call key; the gate holds every thread slot of the GPU until the clean
// reference worker writes the call's sequence number (and, before it, the key) into a host page;
// the inputs are unmasked after the gate, so no work on them can start before the clean side's
// clock says so.  After the call, its outputs are copied into the clean side's output slots, a
// digest of those slots is computed, and the digest and the sequence number are written to the
// host page, which the clean side watches on its own clock.  A digest that matches the slots the
// clean side reads later proves that the outputs were final when the page said "done".
#include <stdint.h>

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// Philox-4x32-10 (Salmon et al., SC'11): 16 bytes of key stream per 128-bit counter.
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}

extern "C" {

// Every thread slot of every multiprocessor waits until the host page's open word reaches seq,
// or until timeout_ns passed (then *status = seq: the gate opened itself).  Only block 0's first
// thread polls the host page (one reader on the bus: the wake-up does not depend on how long the
// gate waited); it first writes seq to *started (the clean side opens only a gate that is running),
// then, once open, copies the 16-byte key written before the open word into key_out[0..3] and
// releases the other blocks through key_out[4] = token (device memory), which they poll.
__global__ void cudal1_gate(const uint32_t* open, uint32_t seq, const uint32_t* key_in, uint32_t* key_out,
                            uint64_t timeout_ns, uint32_t* status, uint32_t* started, uint32_t token) {
    if (threadIdx.x == 0) {
        const uint64_t t0 = globaltimer();
        if (blockIdx.x == 0) {
            store_release_sys(started, seq);
            bool timed_out = false;
            while (load_acquire_sys(open) < seq) {
                if (globaltimer() - t0 >= timeout_ns) {
                    timed_out = true;
                    break;
                }
            }
            for (int i = 0; i < 4; ++i) key_out[i] = ((volatile const uint32_t*)key_in)[i];
            if (timed_out) store_release_sys(status, seq);
            __threadfence();
            asm volatile("st.release.gpu.u32 [%0], %1;" :: "l"(key_out + 4), "r"(token) : "memory");
        } else {
            uint32_t v;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(key_out + 4) : "memory");
            } while (v != token && globaltimer() - t0 < timeout_ns + 1000000);
        }
    }
    __syncthreads();
}

// dst = src XOR key stream, over nbytes (src and dst 16-byte aligned).  The stream of byte b is
// philox(counter = (b / 16, lane ^ key[2], key[3]), key = (key[0], key[1])): lane numbers the
// tensors of one call, so two inputs never share a stream.  Masking and unmasking are the same.
__global__ void cudal1_mask(const uint8_t* src, uint8_t* dst, uint64_t nbytes, const uint32_t* key, uint32_t lane) {
    const uint2 k = make_uint2(key[0], key[1]);
    const uint32_t c2 = lane ^ key[2], c3 = key[3];
    const uint64_t chunks = nbytes / 16;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += stride) {
        uint4 m = philox(make_uint4((uint32_t)i, (uint32_t)(i >> 32), c2, c3), k);
        uint4 v = ((const uint4*)src)[i];
        ((uint4*)dst)[i] = make_uint4(v.x ^ m.x, v.y ^ m.y, v.z ^ m.z, v.w ^ m.w);
    }
    const uint32_t tail = (uint32_t)(nbytes % 16);
    if (blockIdx.x == 0 && threadIdx.x < tail) {
        uint4 m = philox(make_uint4((uint32_t)chunks, (uint32_t)(chunks >> 32), c2, c3), k);
        uint32_t word = (threadIdx.x < 4) ? m.x : (threadIdx.x < 8) ? m.y : (threadIdx.x < 12) ? m.z : m.w;
        uint64_t at = chunks * 16 + threadIdx.x;
        dst[at] = src[at] ^ (uint8_t)(word >> (8 * (threadIdx.x % 4)));
    }
}

// Overwrite n 16-byte words of buf with zeros: evicts the L2 (the buffer is twice its size).
__global__ void cudal1_flush(uint4* buf, uint64_t n) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) buf[i] = make_uint4(0, 0, 0, 0);
}

// *acc += sum over the 8-byte little-endian words w_i of p[0:nbytes] (the last one zero-padded)
// of w_i * (2i + 1), modulo 2^64 (p 8-byte aligned).  Order-free, so the same bytes give the same
// digest in any process.
__global__ void cudal1_digest(const uint8_t* p, uint64_t nbytes, unsigned long long* acc) {
    const uint64_t words = nbytes / 8;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    unsigned long long s = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        s += ((const unsigned long long*)p)[i] * (2 * i + 1);
    if (blockIdx.x == 0 && threadIdx.x == 0 && nbytes % 8) {
        unsigned long long w = 0;
        for (uint32_t j = 0; j < nbytes % 8; ++j) w |= (unsigned long long)p[words * 8 + j] << (8 * j);
        s += w * (2 * words + 1);
    }
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xFFFFFFFFu, s, off);
    if ((threadIdx.x & 31) == 0 && s) atomicAdd(acc, s);
}

// One thread: page[2:4] = *acc (the digest), then page[0] = seq (release, system scope); *acc = 0.
__global__ void cudal1_publish(uint32_t* page, uint32_t seq, unsigned long long* acc) {
    volatile unsigned long long* digest = (volatile unsigned long long*)(page + 2);
    *digest = *acc;
    __threadfence_system();
    store_release_sys(page, seq);
    *acc = 0;
}

// Spin for ns nanoseconds of %globaltimer (the timer's calibration and join probes).
__global__ void cudal1_spin(uint64_t ns) {
    uint64_t t0 = globaltimer();
    while (globaltimer() - t0 < ns) {
    }
}

}  // extern "C"

/*
 * Kiln backend support: the AMX int8 matrix kernel behind the integer dense
 * (docs/decisions/026-amx.md). Compiled into every exported library beside backend.c; generated
 * kernels reference KilnAMXDenseU8S8 weakly and run their own VNNI / AVX2 loops when it is
 * absent or returns non-zero.
 *
 * Sources: Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 1 ch. 18
 * ("Programming with Intel AMX": palette 1, TILECFG layout), vol. 2 (LDTILECFG, TILELOADD,
 * TDPBUSD, TILESTORED, TILERELEASE; CPUID.(EAX=07H,ECX=0):EDX[24] AMX-TILE, EDX[25] AMX-INT8;
 * XCR0 bits 17 XTILECFG and 18 XTILEDATA); Intel Intrinsics Guide (_tile_loadconfig,
 * _tile_loadd, _tile_dpbusd, _tile_stored, _tile_release); Linux kernel
 * Documentation/arch/x86/xstate.rst (arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023,
 * XFEATURE_XTILEDATA = 18): a process must ask for AMX tile data before its first use; the
 * permission is per process, for all its threads).
 */
#define _GNU_SOURCE /* syscall */
#include <kiln/c_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

#define KILN_EXPORT __attribute__((visibility("default")))

/* gcc 11 and clang 12 have the AMX intrinsics (target attributes "amx-tile", "amx-int8") */
#if defined(__x86_64__) && defined(__linux__) && defined(SYS_arch_prctl) && \
    ((defined(__clang__) && __clang_major__ >= 12) ||                        \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define KILN_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* KilnAMXStatus(): why AMX runs or not, decided once per process */
#define KILN_AMX_OK 1
#define KILN_AMX_OFF 0           /* KILN_AMX=0 in the environment */
#define KILN_AMX_NO_CPU (-1)     /* cpuid: no AMX-TILE / AMX-INT8 */
#define KILN_AMX_NO_OS (-2)      /* OSXSAVE off, or XCR0 lacks XTILECFG | XTILEDATA */
#define KILN_AMX_REFUSED (-3)    /* arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed */
#define KILN_AMX_NOT_BUILT (-4)  /* not x86-64 Linux, or the compiler has no AMX intrinsics */

#define KILN_ARCH_GET_XCOMP_PERM 0x1022
#define KILN_ARCH_REQ_XCOMP_PERM 0x1023
#define KILN_XFEATURE_XTILEDATA 18

static int kiln_amx_state = KILN_AMX_NOT_BUILT;
static pthread_once_t kiln_amx_once = PTHREAD_ONCE_INIT;

static void kiln_amx_init(void) {
#ifdef KILN_HAVE_AMX
  const char* env = getenv("KILN_AMX");
  if (env != NULL && strcmp(env, "0") == 0) {
    kiln_amx_state = KILN_AMX_OFF;
    return;
  }
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) {
    kiln_amx_state = KILN_AMX_NO_CPU;
    return;
  }
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) { /* OSXSAVE */
    kiln_amx_state = KILN_AMX_NO_OS;
    return;
  }
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) {
    kiln_amx_state = KILN_AMX_NO_OS;
    return;
  }
  uint64_t perm = 0;
  if (syscall(SYS_arch_prctl, KILN_ARCH_REQ_XCOMP_PERM, KILN_XFEATURE_XTILEDATA) != 0 ||
      syscall(SYS_arch_prctl, KILN_ARCH_GET_XCOMP_PERM, &perm) != 0 ||
      !(perm & (1ull << KILN_XFEATURE_XTILEDATA))) {
    kiln_amx_state = KILN_AMX_REFUSED;
    return;
  }
  kiln_amx_state = KILN_AMX_OK;
#endif
}

/* 1: AMX kernels run; <= 0: they fall back (the KILN_AMX_* codes above). Thread-safe. */
KILN_EXPORT int KilnAMXStatus(void) {
  pthread_once(&kiln_amx_once, kiln_amx_init);
  return kiln_amx_state;
}

#ifdef KILN_HAVE_AMX
/* LDTILECFG's 64-byte operand (SDM vol. 1, 18.2: palette 1) */
typedef struct {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} KilnTileConfig;

/* KilnAMXGemmU8S8's operands (see there) */
typedef struct {
  int32_t* out;
  const uint8_t* a;
  const int32_t* w;
  int64_t batch, m, n, kq, b;
  int64_t lda, a_kblock, a_kstride, a_batch;
  int64_t ldo, o_block, o_bstride, o_batch;
  int64_t kstep, kt; /* quads per full tile step, quads of an A block's tail step */
} KilnAMXGemm;

#define KILN_AMX_ATTR __attribute__((target("amx-tile,amx-int8"), noinline))

/* A tile of `rows` rows (< 16: a zero-padded copy) and `bytes` bytes a row into tmm`t` */
#define KILN_LOAD_A(t, src, bytes)                                                     \
  do {                                                                                 \
    if (rows == 16) {                                                                  \
      _tile_loadd(t, (src), p->lda);                                                   \
    } else {                                                                           \
      memset(apad, 0, sizeof apad);                                                    \
      for (int64_t r = 0; r < rows; ++r) memcpy(apad + r * 64, (src) + r * p->lda, (bytes)); \
      __asm__ volatile("" ::: "memory");                                               \
      _tile_loadd(t, apad, 64);                                                        \
    }                                                                                  \
  } while (0)

/* One block of 16 rows × 32 columns of image `bt`: C0, C1 (tmm0, tmm1) += A (tmm2) · B0, B1
 * (tmm3, tmm4) per step of `kstep` quads; an A block's tail of kt quads uses tmm5 (A) and
 * tmm6, tmm7 (B), configured kt quads deep. Rows past m read zero-padded copies; rows and
 * columns past the output go through a 16 × 16 buffer. */
KILN_AMX_ATTR static void kiln_amx_block(const KilnAMXGemm* p, int64_t bt, int64_t i0,
                                         int64_t j0) {
  int64_t rows = p->m - i0 < 16 ? p->m - i0 : 16;
  int tiles = p->n - j0 > 16 ? 2 : 1;
  const uint8_t* a = p->a + bt * p->a_batch + i0 * p->lda;
  /* column j of the packed weight, quad q: w[(j / b) * kq * b + q * b + j % b] */
  const int32_t* w0 = p->w + (j0 / p->b) * p->kq * p->b + j0 % p->b;
  const int32_t* w1 = p->w + ((j0 + 16) / p->b) * p->kq * p->b + (j0 + 16) % p->b;
  long wstride = (long)p->b * 4;
  int64_t steps = p->a_kblock / p->kstep;
  uint8_t apad[16 * 64] __attribute__((aligned(64)));
  int32_t cbuf[16 * 16] __attribute__((aligned(64)));
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t blk = 0; blk < p->kq / p->a_kblock; ++blk) {
    const uint8_t* ab = a + blk * p->a_kstride;
    int64_t q = blk * p->a_kblock;
    for (int64_t s = 0; s < steps; ++s, q += p->kstep) {
      KILN_LOAD_A(2, ab + s * p->kstep * 4, p->kstep * 4);
      _tile_loadd(3, w0 + q * p->b, wstride);
      _tile_dpbusd(0, 2, 3);
      if (tiles == 2) {
        _tile_loadd(4, w1 + q * p->b, wstride);
        _tile_dpbusd(1, 2, 4);
      }
    }
    if (p->kt > 0) {
      KILN_LOAD_A(5, ab + steps * p->kstep * 4, p->kt * 4);
      _tile_loadd(6, w0 + q * p->b, wstride);
      _tile_dpbusd(0, 5, 6);
      if (tiles == 2) {
        _tile_loadd(7, w1 + q * p->b, wstride);
        _tile_dpbusd(1, 5, 7);
      }
    }
  }
  for (int t = 0; t < tiles; ++t) {
    int64_t j = j0 + 16 * t, cols = p->n - j < 16 ? p->n - j : 16;
    int32_t* out = p->out + bt * p->o_batch + (j / p->o_block) * p->o_bstride + i0 * p->ldo +
                   j % p->o_block;
    if (rows == 16 && cols == 16) {
      if (t == 0) _tile_stored(0, out, p->ldo * 4);
      else _tile_stored(1, out, p->ldo * 4);
      continue;
    }
    if (t == 0) _tile_stored(0, cbuf, 64);
    else _tile_stored(1, cbuf, 64);
    __asm__ volatile("" ::: "memory");
    for (int64_t r = 0; r < rows; ++r) memcpy(out + r * p->ldo, cbuf + r * 16, cols * 4);
  }
}

KILN_AMX_ATTR static int kiln_amx_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  const KilnAMXGemm* p = (const KilnAMXGemm*)cdata;
  KilnTileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  cfg.colsb[2] = (uint16_t)(p->kstep * 4); /* A: 16 × 4·kstep bytes; B: kstep × 64 bytes */
  cfg.rows[3] = cfg.rows[4] = (uint8_t)p->kstep;
  if (p->kt > 0) { /* an A block's tail: A 16 × 4·kt bytes, B kt × 64 bytes */
    cfg.colsb[5] = (uint16_t)(p->kt * 4);
    cfg.rows[6] = cfg.rows[7] = (uint8_t)p->kt;
  }
  _tile_loadconfig(&cfg);
  int64_t row_blocks = (p->m + 15) / 16, col_blocks = (p->n + 31) / 32;
  int64_t per_image = row_blocks * col_blocks, items = p->batch * per_image;
  int64_t tasks = penv->num_task;
  int64_t first = items * task_id / tasks, last = items * (task_id + 1) / tasks;
  for (int64_t it = first; it < last; ++it) {
    int64_t rest = it % per_image;
    kiln_amx_block(p, it / per_image, (rest % row_blocks) * 16, (rest / row_blocks) * 32);
  }
  _tile_release();
  return 0;
}
#endif

/*
 * out[bt, i, j] = Σ_q dot_u8i8x4(A[bt, i, q], W[q, j]) for bt < batch, i < m, j < n: the
 * integer kernels' accumulator (kiln/topi/integer.py: qnn.dense_pack, and qnn.conv2d_NCHWc of a
 * 1×1 stride-1 unpadded conv, rows = pixels) with AMX TDPBUSD tiles. Strides in bytes for A,
 * int32 elements for out:
 *   A: the word of four u8 (k = 4q .. 4q+3) at a + bt·a_batch + (q / a_kblock)·a_kstride +
 *      i·lda + 4·(q % a_kblock): blocks of a_kblock quads (dense: one block of kq quads, rows
 *      lda = 4·kq bytes apart; NCHW{c}c quads: blocks of c/4 quads, one per channel block);
 *   W: int32 [ceil(n / b), kq, b], four s8 along K a word (VNNI-4: byte j of word q is
 *      k = 4q + j), b a multiple of 16: 16 columns of one word row are one 64-byte B row;
 *   out: out + bt·o_batch + (j / o_block)·o_bstride + i·ldo + j % o_block (dense: one block,
 *      ldo = row length; NCHW{o}c: blocks of o channels, ldo = o).
 * Returns 0 when done; non-zero, without writing out, when AMX is not usable here
 * (KilnAMXStatus() <= 0), the shape is below one tile (m < 16 or K = 4·kq < 64), or the blocks
 * do not fit the tiles (b or o_block not a multiple of 16 with o_block < n, kq not a multiple
 * of a_kblock, a_kblock < 16 not dividing 16). Blocks of 16 rows × 32 columns of every image
 * run on the thread pool; each task loads the tile configuration and releases the tiles.
 */
KILN_EXPORT int KilnAMXGemmU8S8(int32_t* out, const uint8_t* a, const int32_t* w, int64_t batch,
                                int64_t m, int64_t n, int64_t kq, int64_t b, int64_t lda,
                                int64_t a_kblock, int64_t a_kstride, int64_t a_batch,
                                int64_t ldo, int64_t o_block, int64_t o_bstride,
                                int64_t o_batch) {
#ifdef KILN_HAVE_AMX
  if (batch < 1 || m < 16 || kq < 16 || n < 1 || b < 16 || b % 16 != 0 || a_kblock < 1 ||
      kq % a_kblock != 0 || (a_kblock < 16 && 16 % a_kblock != 0) ||
      (o_block % 16 != 0 && o_block < n) || KilnAMXStatus() != KILN_AMX_OK)
    return 1;
  int64_t kstep = a_kblock < 16 ? a_kblock : 16;
  KilnAMXGemm p = {out,  a,         w,         batch, m,   n,       kq,        b,
                   lda,  a_kblock,  a_kstride, a_batch, ldo, o_block, o_bstride, o_batch,
                   kstep, a_kblock % kstep};
  int64_t items = batch * ((m + 15) / 16) * ((n + 31) / 32);
  return TVMBackendParallelLaunch(kiln_amx_task, &p, items < 64 ? (int)items : 0) == 0 ? 0 : 1;
#else
  (void)out, (void)a, (void)w, (void)batch, (void)m, (void)n, (void)kq, (void)b, (void)lda;
  (void)a_kblock, (void)a_kstride, (void)a_batch, (void)ldo, (void)o_block, (void)o_bstride;
  (void)o_batch;
  return 1;
#endif
}

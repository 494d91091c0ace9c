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

typedef struct {
  int32_t* out;
  const uint8_t* a;
  const int32_t* w;
  int64_t m, n, kq, b, lda, ldo;
} KilnAMXDense;

#define KILN_AMX_ATTR __attribute__((target("amx-tile,amx-int8"), noinline))

/* One 16-row × 32-column block: C0, C1 (tmm0, tmm1) += A (tmm2) · B0, B1 (tmm3, tmm4) over
 * every 16-quad step of K; a K tail of kt < 16 quads goes through zero-padded copies in tmm5
 * (A: 16 × 4kt bytes) and tmm6, tmm7 (B: kt × 64 bytes). Rows past m and columns past n read
 * zero-padded copies / are not stored. */
KILN_AMX_ATTR static void kiln_amx_block(const KilnAMXDense* p, int64_t i0, int64_t j0) {
  int64_t rows = p->m - i0 < 16 ? p->m - i0 : 16;
  int tiles = p->n - j0 > 16 ? 2 : 1;
  int64_t full = p->kq / 16, kt = p->kq % 16;
  const uint8_t* a = p->a + i0 * p->lda;
  /* column j of the packed weight, quad q: w[(j / b) * kq * b + q * b + j % b] */
  const int32_t* w0 = p->w + (j0 / p->b) * p->kq * p->b + j0 % p->b;
  const int32_t* w1 = p->w + ((j0 + 16) / p->b) * p->kq * p->b + (j0 + 16) % p->b;
  long wstride = (long)p->b * 4;
  uint8_t apad[16 * 64] __attribute__((aligned(64)));
  int32_t bpad[2][16 * 16] __attribute__((aligned(64)));
  int32_t cbuf[16 * 16] __attribute__((aligned(64)));
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t s = 0; s < full; ++s) {
    if (rows == 16) {
      _tile_loadd(2, a + s * 64, p->lda);
    } else {
      memset(apad, 0, sizeof apad);
      for (int64_t r = 0; r < rows; ++r) memcpy(apad + r * 64, a + r * p->lda + s * 64, 64);
      __asm__ volatile("" ::: "memory");
      _tile_loadd(2, apad, 64);
    }
    _tile_loadd(3, w0 + s * 16 * p->b, wstride);
    _tile_dpbusd(0, 2, 3);
    if (tiles == 2) {
      _tile_loadd(4, w1 + s * 16 * p->b, wstride);
      _tile_dpbusd(1, 2, 4);
    }
  }
  if (kt > 0) {
    memset(apad, 0, sizeof apad);
    for (int64_t r = 0; r < rows; ++r) memcpy(apad + r * 64, a + r * p->lda + full * 64, kt * 4);
    for (int t = 0; t < tiles; ++t) {
      const int32_t* w = (t ? w1 : w0) + full * 16 * p->b;
      for (int64_t q = 0; q < kt; ++q) memcpy(bpad[t] + q * 16, w + q * p->b, 64);
    }
    __asm__ volatile("" ::: "memory");
    _tile_loadd(5, apad, 64);
    _tile_loadd(6, bpad[0], 64);
    _tile_dpbusd(0, 5, 6);
    if (tiles == 2) {
      _tile_loadd(7, bpad[1], 64);
      _tile_dpbusd(1, 5, 7);
    }
  }
  for (int t = 0; t < tiles; ++t) {
    int64_t j = j0 + 16 * t, cols = p->n - j < 16 ? p->n - j : 16;
    int32_t* out = p->out + i0 * p->ldo + j;
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
  const KilnAMXDense* p = (const KilnAMXDense*)cdata;
  int64_t kt = p->kq % 16;
  KilnTileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  if (kt > 0) { /* the K tail: A 16 × 4kt bytes, B kt × 64 bytes */
    cfg.colsb[5] = (uint16_t)(kt * 4);
    cfg.rows[6] = cfg.rows[7] = (uint8_t)kt;
  }
  _tile_loadconfig(&cfg);
  int64_t row_blocks = (p->m + 15) / 16, col_blocks = (p->n + 31) / 32;
  int64_t items = row_blocks * col_blocks, tasks = penv->num_task;
  int64_t first = items * task_id / tasks, last = items * (task_id + 1) / tasks;
  for (int64_t it = first; it < last; ++it)
    kiln_amx_block(p, (it % row_blocks) * 16, (it / row_blocks) * 32);
  _tile_release();
  return 0;
}
#endif

/*
 * out[i, j] = Σ_q dot_u8i8x4(a_words[i, q], w[j / b, q, j % b]) for i < m, j < n: the integer
 * dense's accumulator (kiln/ops/integer.py, qnn.dense_pack) with AMX TDPBUSD tiles.
 *   out: int32 [m, ldo], row stride ldo >= n elements;
 *   a:   uint8 [m, lda] (the activation quads: 4·kq bytes of row i at a + i·lda);
 *   w:   int32 [ceil(n / b), kq, b], four int8 along K per word (VNNI-4: byte j of word q is
 *        k = 4q + j), b a multiple of 16 (16 columns of one word row are one 64-byte B row).
 * Returns 0 when done; non-zero when AMX is not usable here (KilnAMXStatus() <= 0), the shape
 * is below one tile (m < 16 or K = 4·kq < 64) or b is not a multiple of 16: the caller then
 * runs its own loops. Row × 32-column blocks run on the thread pool (each task loads the tile
 * configuration and releases the tiles).
 */
KILN_EXPORT int KilnAMXDenseU8S8(int32_t* out, const uint8_t* a, const int32_t* w, int64_t m,
                                 int64_t n, int64_t kq, int64_t b, int64_t lda, int64_t ldo) {
#ifdef KILN_HAVE_AMX
  if (m < 16 || kq < 16 || b % 16 != 0 || KilnAMXStatus() != KILN_AMX_OK) return 1;
  KilnAMXDense p = {out, a, w, m, n, kq, b, lda, ldo};
  int64_t items = ((m + 15) / 16) * ((n + 31) / 32);
  return TVMBackendParallelLaunch(kiln_amx_task, &p, items < 64 ? (int)items : 0) == 0 ? 0 : 1;
#else
  (void)out, (void)a, (void)w, (void)m, (void)n, (void)kq, (void)b, (void)lda, (void)ldo;
  return 1;
#endif
}

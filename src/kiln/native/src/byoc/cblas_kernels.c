/* Kiln BYOC "cblas": support code pasted at the top of every generated cblas source (one
 * translation unit with the generated functions). Everything is static: each library has its own
 * copy. Algorithms: im2col + GEMM convolution (Chellapilla et al. 2006, as in Caffe and TVM's
 * topi/x86 fallback); GEMM is OpenBLAS's cblas_sgemm (row-major). */
#include <kiln/c_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CBLAS ABI (cblas.h; enums are ints). Declared here, not included, so the source compiles
 * without the BLAS headers' include path (only the link needs the library). */
enum { KilnCblasRowMajor = 101 };
enum { KilnCblasNoTrans = 111, KilnCblasTrans = 112 };
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int num_threads);

#define KILN_EXPORT __attribute__((visibility("default")))
#define KILN_ARG(i) ((DLTensor*)args[(i)].v_handle)

/* KILN_NUM_THREADS caps OpenBLAS's threads too (Kiln's kernels: support/backend.c). */
__attribute__((constructor)) static void kiln_cblas_init_threads(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    long n = strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n < 65536) openblas_set_num_threads((int)n);
  }
}

static int kiln_cblas_fail(const char* symbol, const char* what) {
  char msg[256];
  snprintf(msg, sizeof(msg), "%s: %s", symbol, what);
  TVMAPISetLastError(msg);
  return -1;
}

/* The data of argument i, after checking it is a compact float32/int DLTensor of this shape. */
static void* kiln_cblas_arg(TVMValue* args, int32_t* type_codes, int i, int ndim,
                            const int64_t* shape, uint8_t code, uint8_t bits) {
  if (type_codes[i] != kTVMDLTensorHandle && type_codes[i] != kTVMNDArrayHandle) return NULL;
  const DLTensor* t = KILN_ARG(i);
  if (t == NULL || t->ndim != ndim || t->dtype.code != code || t->dtype.bits != bits ||
      t->dtype.lanes != 1)
    return NULL;
  int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (t->shape[d] != shape[d]) return NULL;
    if (t->strides != NULL && t->shape[d] != 1 && t->strides[d] != expect) return NULL;
    expect *= t->shape[d];
  }
  return (char*)t->data + t->byte_offset;
}

static int kiln_cblas_ceil_div(int a, int b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

/* body(ctx, begin, end) over static chunks of [0, n) on the support code's thread pool
 * (TVMBackendParallelLaunch, the kernels' own; no OpenMP runtime is linked). */
typedef struct {
  int64_t n;
  void (*body)(const void* ctx, int64_t begin, int64_t end);
  const void* ctx;
} KilnCblasFor;

static int kiln_cblas_for_task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  const KilnCblasFor* f = (const KilnCblasFor*)cdata;
  int64_t chunk = (f->n + penv->num_task - 1) / penv->num_task;
  int64_t begin = (int64_t)task_id * chunk, end = begin + chunk;
  if (end > f->n) end = f->n;
  if (begin < end) f->body(f->ctx, begin, end);
  return 0;
}

static void kiln_cblas_parallel_for(int64_t n, void (*body)(const void*, int64_t, int64_t),
                                    const void* ctx) {
  KilnCblasFor f = {n, body, ctx};
  TVMBackendParallelLaunch(kiln_cblas_for_task, &f, 0); /* the tasks cannot fail */
}

typedef struct {
  const float* x;
  float* col;
  int c_n, h, w, kh_n, kw_n, sh, sw, pt, pl, dh, dw, oh_n, ow_n;
} KilnIm2col;

/* col[(c*kh_n + kh)*kw_n + kw][oh*ow_n + ow] = x[c][oh*sh - pt + kh*dh][ow*sw - pl + kw*dw],
 * 0 outside x. The valid output columns of each kernel column are computed once, so the copy
 * has no per-element test (a memcpy at stride 1). */
static void kiln_cblas_im2col_rows(const void* ctx, int64_t begin, int64_t end) {
  const KilnIm2col* a = (const KilnIm2col*)ctx;
  const float* x = a->x;
  float* col = a->col;
  int h = a->h, w = a->w, kh_n = a->kh_n, kw_n = a->kw_n, sh = a->sh, sw = a->sw, pt = a->pt;
  int pl = a->pl, dh = a->dh, dw = a->dw, oh_n = a->oh_n, ow_n = a->ow_n;
  for (int r = (int)begin; r < (int)end; ++r) {
    int kw = r % kw_n, kh = (r / kw_n) % kh_n, c = r / (kw_n * kh_n);
    const float* xc = x + (int64_t)c * h * w;
    float* out = col + (int64_t)r * oh_n * ow_n;
    int off = kw * dw - pl; /* iw = ow * sw + off */
    int lo = kiln_cblas_ceil_div(-off, sw), hi = kiln_cblas_ceil_div(w - off, sw);
    lo = lo < 0 ? 0 : (lo > ow_n ? ow_n : lo);
    hi = hi < lo ? lo : (hi > ow_n ? ow_n : hi);
    for (int oh = 0; oh < oh_n; ++oh) {
      int ih = oh * sh - pt + kh * dh;
      float* o = out + (int64_t)oh * ow_n;
      if (ih < 0 || ih >= h) {
        memset(o, 0, sizeof(float) * (size_t)ow_n);
        continue;
      }
      const float* xr = xc + (int64_t)ih * w + off;
      if (lo > 0) memset(o, 0, sizeof(float) * (size_t)lo);
      if (sw == 1) {
        memcpy(o + lo, xr + lo, sizeof(float) * (size_t)(hi - lo));
      } else {
        for (int ow = lo; ow < hi; ++ow) o[ow] = xr[ow * sw];
      }
      if (hi < ow_n) memset(o + hi, 0, sizeof(float) * (size_t)(ow_n - hi));
    }
  }
}

static void kiln_cblas_im2col(const float* x, float* col, int c_n, int h, int w, int kh_n,
                              int kw_n, int sh, int sw, int pt, int pl, int dh, int dw, int oh_n,
                              int ow_n) {
  KilnIm2col a = {x, col, c_n, h, w, kh_n, kw_n, sh, sw, pt, pl, dh, dw, oh_n, ow_n};
  kiln_cblas_parallel_for((int64_t)c_n * kh_n * kw_n, kiln_cblas_im2col_rows, &a);
}

/* out[N, O, OH, OW] = conv2d(x[N, C, H, W], w[O, C/groups, KH, KW]) */
static int kiln_cblas_conv2d(const char* symbol, const float* x, const float* w, float* out,
                             int n_n, int c_n, int h, int wd, int o_n, int kh_n, int kw_n, int sh,
                             int sw, int pt, int pl, int dh, int dw, int oh_n, int ow_n,
                             int groups) {
  int cg = c_n / groups, og = o_n / groups;
  int k = cg * kh_n * kw_n, hw = oh_n * ow_n;
  int direct = kh_n == 1 && kw_n == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 &&
               oh_n == h && ow_n == wd;
  float* col = NULL;
  if (!direct) {
    col = (float*)TVMBackendAllocWorkspace(kDLCPU, 0, (uint64_t)k * hw * sizeof(float), 2, 32);
    if (col == NULL) return kiln_cblas_fail(symbol, "out of memory for the im2col buffer");
  }
  for (int n = 0; n < n_n; ++n) {
    for (int g = 0; g < groups; ++g) {
      const float* xg = x + ((int64_t)n * c_n + (int64_t)g * cg) * h * wd;
      const float* b = xg;
      if (!direct) {
        kiln_cblas_im2col(xg, col, cg, h, wd, kh_n, kw_n, sh, sw, pt, pl, dh, dw, oh_n, ow_n);
        b = col;
      }
      cblas_sgemm(KilnCblasRowMajor, KilnCblasNoTrans, KilnCblasNoTrans, og, hw, k, 1.0f,
                  w + (int64_t)g * og * k, k, b, hw, 0.0f,
                  out + ((int64_t)n * o_n + (int64_t)g * og) * hw, hw);
    }
  }
  if (col != NULL) TVMBackendFreeWorkspace(kDLCPU, 0, col);
  return 0;
}

/* out[M, N] = x[M, K] @ w[N, K]^T */
static void kiln_cblas_dense(const float* x, const float* w, float* out, int m, int n, int k) {
  cblas_sgemm(KilnCblasRowMajor, KilnCblasNoTrans, KilnCblasTrans, m, n, k, 1.0f, x, k, w, k,
              0.0f, out, n);
}

/* out[b, M, N] = a[b, M, K] @ b[b, K, N]; a_step/b_step: 0 for an operand broadcast over b */
static void kiln_cblas_matmul(const float* a, const float* b, float* out, int batch, int m,
                              int n, int k, int64_t a_step, int64_t b_step) {
  for (int i = 0; i < batch; ++i)
    cblas_sgemm(KilnCblasRowMajor, KilnCblasNoTrans, KilnCblasNoTrans, m, n, k, 1.0f,
                a + i * a_step, k, b + i * b_step, n, 0.0f, out + (int64_t)i * m * n, n);
}

enum { KILN_ACT_NONE = 0, KILN_ACT_RELU = 1, KILN_ACT_CLIP = 2, KILN_ACT_HARDSWISH = 3 };

/* o[0:n] = act((o + bias) + res): ``bv`` a scalar bias, or ``bvec`` a bias per element. Each
 * step is its own simple loop (vectorized by the compiler), the activation's switch outside. */
static void kiln_cblas_span(float* restrict o, int64_t n, const float* bv,
                            const float* restrict bvec, const float* restrict res, int act,
                            float lo, float hi) {
  if (bv != NULL) {
    float b = *bv;
    for (int64_t i = 0; i < n; ++i) o[i] = o[i] + b;
  }
  if (bvec != NULL)
    for (int64_t i = 0; i < n; ++i) o[i] = o[i] + bvec[i];
  if (res != NULL)
    for (int64_t i = 0; i < n; ++i) o[i] = o[i] + res[i];
  switch (act) {
    case KILN_ACT_RELU:
      for (int64_t i = 0; i < n; ++i) o[i] = o[i] > 0.0f ? o[i] : 0.0f;
      break;
    case KILN_ACT_CLIP:
      for (int64_t i = 0; i < n; ++i) o[i] = o[i] < lo ? lo : (o[i] > hi ? hi : o[i]);
      break;
    case KILN_ACT_HARDSWISH:
      for (int64_t i = 0; i < n; ++i) {
        float t = o[i] * (1.0f / 6.0f) + 0.5f;
        t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
        o[i] = o[i] * t;
      }
      break;
    default:
      break;
  }
}

typedef struct {
  float* out;
  int64_t channels, inner;
  const float *bias, *residual;
  int act;
  float lo, hi;
} KilnEpilogue;

/* Rows [begin, end) of ``channels`` (inner == 1: dense / matmul, a bias vector per row). */
static void kiln_cblas_epilogue_rows(const void* ctx, int64_t begin, int64_t end) {
  const KilnEpilogue* e = (const KilnEpilogue*)ctx;
  for (int64_t r = begin; r < end; ++r)
    kiln_cblas_span(e->out + r * e->channels, e->channels, NULL, e->bias,
                    e->residual != NULL ? e->residual + r * e->channels : NULL, e->act, e->lo,
                    e->hi);
}

/* Rows [begin, end) of ``inner``, row r of channel r % channels (a scalar bias). */
static void kiln_cblas_epilogue_planes(const void* ctx, int64_t begin, int64_t end) {
  const KilnEpilogue* e = (const KilnEpilogue*)ctx;
  for (int64_t r = begin; r < end; ++r)
    kiln_cblas_span(e->out + r * e->inner, e->inner,
                    e->bias != NULL ? e->bias + r % e->channels : NULL, NULL,
                    e->residual != NULL ? e->residual + r * e->inner : NULL, e->act, e->lo,
                    e->hi);
}

/* out viewed as [outer, channels, inner]: out = act((out + bias[c]) + residual) in place. */
static void kiln_cblas_epilogue(float* out, int64_t outer, int64_t channels, int64_t inner,
                                const float* bias, const float* residual, int act, float lo,
                                float hi) {
  KilnEpilogue e = {out, channels, inner, bias, residual, act, lo, hi};
  if (inner == 1)
    kiln_cblas_parallel_for(outer, kiln_cblas_epilogue_rows, &e);
  else
    kiln_cblas_parallel_for(outer * channels, kiln_cblas_epilogue_planes, &e);
}

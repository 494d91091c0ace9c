/*
 * The built-in kernels of the kiln_json runtime in C, float32: the ops of
 * kiln/runtime/contrib/json/json_kernels.py with numpy's semantics (broadcasting of the elementwise ops,
 * np.matmul's batch rules, max pooling whose windows past the padding read -inf). Each kernel's
 * prepare() reads its attrs and checks every shape at load, so run() only computes.
 * Convolution is im2col (skipped for 1x1 stride-1 unpadded convs) + a matrix product blocked
 * four output rows at a time, as Python's im2col + numpy's BLAS: the sums agree up to float
 * rounding order.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* the kernels' inner loops are written to vectorize; GCC does that from -O3 (clang at -O2) */
#pragma GCC optimize("O3")
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_json.h"

/* -- attrs */
static int kiln_attr_tok(const KilnJsonAttrs* a, const char* key) {
  return KilnJson_Get(a->js, a->toks, a->obj, key);
}

/* attr `key`: a list of exactly n integers in [lo, 2^20) (strides, dilations, paddings and
   window sizes: bounded so that index arithmetic over dims below 2^40 cannot overflow) */
static int kiln_attr_ints(const KilnJsonAttrs* a, const char* key, int n, int64_t lo,
                          int64_t* out) {
  int tok = kiln_attr_tok(a, key), i;
  if (tok < 0 || a->toks[tok].type != KILN_JSON_ARRAY || a->toks[tok].size != n)
    return kiln_fail("%s: attr '%s' must be a list of %d integers", a->where, key, n);
  for (i = 0; i < n; ++i)
    if (KilnJson_Int(a->js, a->toks, KilnJson_At(a->toks, tok, i), &out[i]) != 0 ||
        out[i] < lo || out[i] >= ((int64_t)1 << 20))
      return kiln_fail("%s: attr '%s' must be a list of %d integers in [%lld, 2^20)", a->where,
                       key, n, (long long)lo);
  return 0;
}

/* attr `key`: an integer; `dflt` when absent (or -1 for a required attr) */
static int kiln_attr_int(const KilnJsonAttrs* a, const char* key, int64_t dflt, int64_t* out) {
  int tok = kiln_attr_tok(a, key);
  if (tok < 0 && dflt >= 0) {
    *out = dflt;
    return 0;
  }
  if (KilnJson_Int(a->js, a->toks, tok, out) != 0 || *out <= -((int64_t)1 << 40) ||
      *out >= ((int64_t)1 << 40))
    return kiln_fail("%s: attr '%s' must be an integer", a->where, key);
  return 0;
}

static int kiln_attr_float(const KilnJsonAttrs* a, const char* key, float* out) {
  int tok = kiln_attr_tok(a, key);
  char buf[64], *end;
  size_t n;
  if (tok < 0 || a->toks[tok].type != KILN_JSON_PRIMITIVE ||
      (n = (size_t)(a->toks[tok].end - a->toks[tok].start)) == 0 || n >= sizeof(buf))
    return kiln_fail("%s: attr '%s' must be a number", a->where, key);
  memcpy(buf, a->js + a->toks[tok].start, n);
  buf[n] = 0;
  *out = strtof(buf, &end);
  if (end != buf + n) return kiln_fail("%s: attr '%s' must be a number", a->where, key);
  return 0;
}

static int kiln_bad_shapes(const KilnJsonNode* node, const KilnJsonAttrs* a, const char* rule) {
  return kiln_fail("%s: input and output shapes do not fit %s (%s)", a->where, node->name, rule);
}

/* -- broadcasting (numpy's, right-aligned, to the output's shape) */
/* Element strides of an input of `shape` read at each index of `out` (0 where broadcast);
   -1 when it does not broadcast to `out`. */
static int kiln_bcast_strides(const int64_t* shape, int nd, const KilnJsonTensor* out,
                              int64_t* st) {
  int64_t step = 1;
  int d, k;
  if (nd > out->ndim) return -1;
  for (d = out->ndim - 1, k = nd - 1; d >= 0; --d, --k) {
    int64_t dim = k >= 0 ? shape[k] : 1;
    if (dim != 1 && dim != out->shape[d]) return -1;
    st[d] = dim == 1 ? 0 : step;
    step *= dim;
  }
  return 0;
}

enum { KILN_EW_ADD, KILN_EW_MUL, KILN_EW_RELU, KILN_EW_CLIP };

static void kiln_ew_row(const KilnJsonNode* node, float* o, const float* a, int64_t sa,
                        const float* b, int64_t sb, int64_t n) {
  int64_t i;
  float lo = node->f[0], hi = node->f[1];
  switch (node->p[0]) {
    case KILN_EW_ADD:
      for (i = 0; i < n; ++i) o[i] = a[i * sa] + b[i * sb];
      break;
    case KILN_EW_MUL:
      for (i = 0; i < n; ++i) o[i] = a[i * sa] * b[i * sb];
      break;
    case KILN_EW_RELU: /* np.maximum(x, 0): NaN stays NaN */
      for (i = 0; i < n; ++i) o[i] = a[i * sa] < 0.0f ? 0.0f : a[i * sa];
      break;
    default: /* np.clip = minimum(maximum(x, lo), hi) */
      for (i = 0; i < n; ++i) {
        float v = a[i * sa] < lo ? lo : a[i * sa];
        o[i] = v > hi ? hi : v;
      }
  }
}

/* The second operand of bias_add: b as shape [b.size, 1 x (ndim - axis - 1)]. */
static int kiln_bias_shape(const KilnJsonNode* node, int64_t* shape) {
  const KilnJsonTensor* x = node->in_types[0];
  int nd = x->ndim - (int)node->p[1], d;
  shape[0] = node->in_types[1]->size;
  for (d = 1; d < nd; ++d) shape[d] = 1;
  return nd;
}

static int kiln_ew_run(const KilnJsonNode* node, const float* const* ins, float* out) {
  const KilnJsonTensor* t = &node->type;
  int64_t sa[KILN_JSON_MAX_NDIM], sb[KILN_JSON_MAX_NDIM], idx[KILN_JSON_MAX_NDIM] = {0};
  int64_t bshape[KILN_JSON_MAX_NDIM], oa = 0, ob = 0, o, inner;
  int nd = t->ndim, d, bnd;
  const float* b = node->num_inputs > 1 ? ins[1] : ins[0];
  if (nd == 0) {
    kiln_ew_row(node, out, ins[0], 0, b, 0, t->size);
    return 0;
  }
  kiln_bcast_strides(node->in_types[0]->shape, node->in_types[0]->ndim, t, sa);
  if (node->p[2]) { /* bias_add */
    bnd = kiln_bias_shape(node, bshape);
    kiln_bcast_strides(bshape, bnd, t, sb);
  } else {
    kiln_bcast_strides(node->in_types[node->num_inputs - 1]->shape,
                       node->in_types[node->num_inputs - 1]->ndim, t, sb);
  }
  inner = t->shape[nd - 1];
  for (o = 0; inner > 0 && o < t->size; o += inner) {
    kiln_ew_row(node, out + o, ins[0] + oa, sa[nd - 1], b + ob, sb[nd - 1], inner);
    for (d = nd - 2; d >= 0; --d) { /* the next row: an odometer over the outer dims */
      oa += sa[d];
      ob += sb[d];
      if (++idx[d] < t->shape[d]) break;
      oa -= sa[d] * idx[d];
      ob -= sb[d] * idx[d];
      idx[d] = 0;
    }
  }
  return 0;
}

static int kiln_ew_prepare(KilnJsonNode* node, const KilnJsonAttrs* a, int op) {
  int64_t st[KILN_JSON_MAX_NDIM], bshape[KILN_JSON_MAX_NDIM];
  int k;
  node->p[0] = op;
  if (op == KILN_EW_CLIP &&
      (kiln_attr_float(a, "a_min", &node->f[0]) != 0 ||
       kiln_attr_float(a, "a_max", &node->f[1]) != 0))
    return -1;
  for (k = 0; k < node->num_inputs; ++k) {
    const KilnJsonTensor* in = node->in_types[k];
    if (node->p[2] && k == 1) {
      int nd = kiln_bias_shape(node, bshape);
      if (kiln_bcast_strides(bshape, nd, &node->type, st) != 0)
        return kiln_bad_shapes(node, a, "the bias broadcast along 'axis' to the output");
    } else if (kiln_bcast_strides(in->shape, in->ndim, &node->type, st) != 0) {
      return kiln_bad_shapes(node, a, "the inputs broadcast to the output");
    }
  }
  return 0;
}

static int kiln_add_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  return kiln_ew_prepare(n, a, KILN_EW_ADD);
}
static int kiln_mul_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  return kiln_ew_prepare(n, a, KILN_EW_MUL);
}
static int kiln_relu_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  return kiln_ew_prepare(n, a, KILN_EW_RELU);
}
static int kiln_clip_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  return kiln_ew_prepare(n, a, KILN_EW_CLIP);
}
static int kiln_bias_add_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  int64_t axis;
  int nd = n->in_types[0]->ndim;
  if (kiln_attr_int(a, "axis", -1, &axis) != 0) return -1;
  if (nd == 0) return kiln_bad_shapes(n, a, "a bias along an axis of the data");
  n->p[1] = ((axis % nd) + nd) % nd; /* Python's modulo */
  n->p[2] = 1;
  return kiln_ew_prepare(n, a, KILN_EW_ADD);
}

/* -- conv2d: p = groups, stride h w, dilation h w, padding t l b r, bias, relu */
static int kiln_conv_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  const KilnJsonTensor *x = n->in_types[0], *w = n->in_types[1], *y = &n->type;
  int64_t* p = n->p;
  int64_t g, d, act = 0;
  int tok;
  if (kiln_attr_int(a, "groups", -1, &p[0]) != 0 || kiln_attr_ints(a, "strides", 2, 1, &p[1]) ||
      kiln_attr_ints(a, "dilation", 2, 1, &p[3]) || kiln_attr_ints(a, "padding", 4, 0, &p[5]))
    return -1;
  if (strncmp(n->name, "kiln_json.", 10) == 0) { /* a composite: bias and activation */
    if (kiln_attr_int(a, "bias", 0, &p[9]) != 0) return -1;
    tok = kiln_attr_tok(a, "activation");
    if (tok >= 0 && !KilnJson_Equals(a->js, a->toks, tok, "") &&
        !(act = KilnJson_Equals(a->js, a->toks, tok, "relu")))
      return kiln_fail("%s: kiln_json: unknown activation (only \"relu\" or \"\")", a->where);
    p[10] = act;
  }
  if (n->num_inputs != (p[9] ? 3 : 2))
    return kiln_fail("%s: %s takes %d inputs, has %d", a->where, n->name, p[9] ? 3 : 2,
                     n->num_inputs);
  g = p[0];
  if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || g < 1 || w->shape[0] % g != 0 ||
      x->shape[1] != w->shape[1] * g || y->shape[0] != x->shape[0] || y->shape[1] != w->shape[0])
    return kiln_bad_shapes(n, a, "x[N, C, H, W], w[O, C/groups, KH, KW], out[N, O, OH, OW]");
  for (d = 0; d < 2; ++d) {
    int64_t span = x->shape[2 + d] + p[5 + d] + p[7 + d] - p[3 + d] * (w->shape[2 + d] - 1) - 1;
    if (w->shape[2 + d] < 1 || span < 0 || y->shape[2 + d] != span / p[1 + d] + 1)
      return kiln_bad_shapes(n, a, "OH, OW = (H + pads - dilation * (K - 1) - 1) / stride + 1");
  }
  if (p[9] && n->in_types[2]->size != w->shape[0] && n->in_types[2]->size != 1)
    return kiln_bad_shapes(n, a, "a bias of O values");
  return 0;
}

/* Output index range [lo, hi) whose input index i*stride - pad + off lies in [0, size). */
static void kiln_conv_range(int64_t size, int64_t stride, int64_t pad, int64_t off, int64_t out,
                            int64_t* lo, int64_t* hi) {
  int64_t a = pad - off;
  *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  *hi = size - 1 + a < 0 ? 0 : (size - 1 + a) / stride + 1;
  if (*hi > out) *hi = out;
  if (*lo > *hi) *lo = *hi;
}

/* y[rows, P] = w[rows, K] @ cols[K, P]: four rows at a time over column blocks that stay in
   the L1 cache (each cols row read once per four output rows). */
static void kiln_gemm(const float* w, int64_t K, const float* cols, int64_t P, float* y,
                      int64_t rows) {
  enum { BLOCK = 512 };
  int64_t o, k, p, p0, np;
  for (p0 = 0; p0 < P; p0 += BLOCK) {
    np = P - p0 < BLOCK ? P - p0 : BLOCK;
    for (o = 0; o < rows; o += 4) {
      float *restrict y0, *restrict y1, *restrict y2, *restrict y3;
      if (o + 4 > rows) { /* the last one to three rows, one at a time */
        int64_t r;
        for (r = o; r < rows; ++r) {
          float* restrict yr = y + r * P + p0;
          memset(yr, 0, (size_t)np * sizeof(float));
          for (k = 0; k < K; ++k)
            for (p = 0; p < np; ++p) yr[p] += w[r * K + k] * cols[k * P + p0 + p];
        }
        break;
      }
      y0 = y + o * P + p0;
      y1 = y0 + P;
      y2 = y1 + P;
      y3 = y2 + P;
      memset(y0, 0, (size_t)np * sizeof(float));
      memset(y1, 0, (size_t)np * sizeof(float));
      memset(y2, 0, (size_t)np * sizeof(float));
      memset(y3, 0, (size_t)np * sizeof(float));
      for (k = 0; k < K; ++k) {
        const float* restrict c = cols + k * P + p0;
        float a0 = w[o * K + k], a1 = w[(o + 1) * K + k], a2 = w[(o + 2) * K + k];
        float a3 = w[(o + 3) * K + k];
        for (p = 0; p < np; ++p) {
          float v = c[p];
          y0[p] += a0 * v;
          y1[p] += a1 * v;
          y2[p] += a2 * v;
          y3[p] += a3 * v;
        }
      }
    }
  }
}

/* cols[(c * KH + ki) * KW + kj, oh * OW + ow] = x[c, oh*sh - pt + ki*dh, ow*sw - pl + kj*dw]
   (0 in the padding) for one group's channels */
static void kiln_im2col(const KilnJsonNode* n, const float* x, float* cols) {
  const int64_t* p = n->p;
  int64_t CG = n->in_types[1]->shape[1], KH = n->in_types[1]->shape[2];
  int64_t KW = n->in_types[1]->shape[3], H = n->in_types[0]->shape[2];
  int64_t W = n->in_types[0]->shape[3], OH = n->type.shape[2], OW = n->type.shape[3];
  int64_t c, ki, kj, oh, ow, lo, hi;
  for (c = 0; c < CG; ++c) {
    for (ki = 0; ki < KH; ++ki) {
      for (kj = 0; kj < KW; ++kj) {
        float* row = cols + ((c * KH + ki) * KW + kj) * OH * OW;
        kiln_conv_range(W, p[2], p[6], kj * p[4], OW, &lo, &hi);
        for (oh = 0; oh < OH; ++oh) {
          int64_t ih = oh * p[1] - p[5] + ki * p[3];
          float* r = row + oh * OW;
          if (ih < 0 || ih >= H) {
            memset(r, 0, (size_t)OW * sizeof(float));
            continue;
          }
          for (ow = 0; ow < lo; ++ow) r[ow] = 0.0f;
          for (ow = lo; ow < hi; ++ow) r[ow] = x[(c * H + ih) * W + ow * p[2] - p[6] + kj * p[4]];
          for (ow = hi; ow < OW; ++ow) r[ow] = 0.0f;
        }
      }
    }
  }
}

/* im2col (not for 1x1 stride-1 unpadded convs: the input is the matrix) + kiln_gemm per image
   and group, then the bias and relu epilogue */
static int kiln_conv_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  const int64_t* p = n->p;
  const KilnJsonTensor *xt = n->in_types[0], *wt = n->in_types[1];
  int64_t N = xt->shape[0], C = xt->shape[1], H = xt->shape[2], W = xt->shape[3];
  int64_t O = wt->shape[0], CG = wt->shape[1], K = CG * wt->shape[2] * wt->shape[3];
  int64_t P = n->type.shape[2] * n->type.shape[3], og = O / p[0], b, g, o, i;
  int direct = wt->shape[2] == 1 && wt->shape[3] == 1 && p[1] == 1 && p[2] == 1 && !p[5] &&
               !p[6] && !p[7] && !p[8];
  float* cols = NULL;
  if (!direct && K && P && (cols = (float*)malloc((size_t)(K * P) * sizeof(float))) == NULL)
    return kiln_fail("kiln_json: out of memory (%lld bytes of convolution columns)",
                     (long long)(K * P * 4));
  for (b = 0; b < N; ++b) {
    for (g = 0; g < p[0]; ++g) {
      const float* x = ins[0] + (b * C + g * CG) * H * W;
      if (!direct && cols) kiln_im2col(n, x, cols);
      kiln_gemm(ins[1] + g * og * K, K, direct ? x : cols, P, out + (b * O + g * og) * P, og);
    }
    for (o = 0; o < O; ++o) {
      float* y = out + (b * O + o) * P;
      if (p[9]) {
        float bias = ins[2][n->in_types[2]->size == 1 ? 0 : o];
        for (i = 0; i < P; ++i) y[i] += bias;
      }
      if (p[10])
        for (i = 0; i < P; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
    }
  }
  free(cols);
  return 0;
}

/* -- nn.dense (x @ w.T) and nn.matmul (np.matmul): p = M, K, N, transposed b, batch rank */
static int kiln_matmul_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  const KilnJsonTensor *x = n->in_types[0], *w = n->in_types[1], *y = &n->type;
  int dense = strcmp(n->name, "nn.dense") == 0, d, xb, wb, nb;
  int64_t want[KILN_JSON_MAX_NDIM], k;
  if (x->ndim < 1 || w->ndim < 1 || (dense && w->ndim != 2))
    return kiln_bad_shapes(n, a, "matrices");
  n->p[3] = dense;
  n->p[0] = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
  n->p[1] = k = x->shape[x->ndim - 1];
  if (dense) { /* x[..., K] @ w[N, K].T: the batch dims of x are rows */
    n->p[2] = w->shape[0];
    for (n->p[0] = 1, d = 0; d < x->ndim - 1; ++d) n->p[0] *= want[d] = x->shape[d];
    want[d] = w->shape[0];
    n->p[4] = 0;
    nb = x->ndim;
    if (w->shape[1] != k) return kiln_bad_shapes(n, a, "x[..., K], w[N, K]");
  } else { /* np.matmul: 1-D operands promoted, batch dims broadcast */
    n->p[2] = w->ndim >= 2 ? w->shape[w->ndim - 1] : 1;
    if ((w->ndim >= 2 ? w->shape[w->ndim - 2] : w->shape[0]) != k)
      return kiln_bad_shapes(n, a, "a[..., M, K] @ b[..., K, N]");
    xb = x->ndim >= 2 ? x->ndim - 2 : 0;
    wb = w->ndim >= 2 ? w->ndim - 2 : 0;
    nb = xb > wb ? xb : wb;
    for (d = 0; d < nb; ++d) {
      int64_t dx = d - (nb - xb) >= 0 ? x->shape[d - (nb - xb)] : 1;
      int64_t dw = d - (nb - wb) >= 0 ? w->shape[d - (nb - wb)] : 1;
      if (dx != dw && dx != 1 && dw != 1) return kiln_bad_shapes(n, a, "broadcast batch dims");
      want[d] = dx == 1 ? dw : dx;
    }
    n->p[4] = nb;
    if (x->ndim >= 2) want[nb++] = n->p[0];
    if (w->ndim >= 2) want[nb++] = n->p[2];
  }
  if (y->ndim != nb) return kiln_bad_shapes(n, a, "the output of the product");
  for (d = 0; d < nb; ++d)
    if (y->shape[d] != want[d]) return kiln_bad_shapes(n, a, "the output of the product");
  return 0;
}

/* Offset (in matrices) of batch `i` of the output in an operand with batch dims
   shape[0..nd) (right-aligned, broadcast). */
static int64_t kiln_batch_offset(int64_t i, const KilnJsonTensor* out, int nb, const int64_t* shape,
                                 int nd) {
  int64_t off = 0, step = 1;
  int d, k;
  for (d = nb - 1, k = nd - 1; d >= 0; --d, --k) {
    int64_t idx = i % out->shape[d];
    i /= out->shape[d];
    if (k >= 0) {
      if (shape[k] != 1) off += idx * step;
      step *= shape[k];
    }
  }
  return off;
}

static int kiln_matmul_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  int64_t M = n->p[0], K = n->p[1], N = n->p[2], nb = n->p[4], batches = 1, bi, m, k, j;
  const KilnJsonTensor *x = n->in_types[0], *w = n->in_types[1];
  int xb = x->ndim >= 2 ? x->ndim - 2 : 0, wb = w->ndim >= 2 ? w->ndim - 2 : 0;
  for (bi = 0; bi < nb; ++bi) batches *= n->type.shape[bi];
  for (bi = 0; bi < batches; ++bi) {
    const float* a = ins[0] + kiln_batch_offset(bi, &n->type, (int)nb, x->shape, xb) * M * K;
    const float* b = ins[1] + kiln_batch_offset(bi, &n->type, (int)nb, w->shape, wb) * K * N;
    float* y = out + bi * M * N;
    for (m = 0; m < M; ++m) {
      float* yr = y + m * N;
      if (n->p[3]) { /* dense: rows of w */
        for (j = 0; j < N; ++j) {
          float s = 0.0f;
          for (k = 0; k < K; ++k) s += a[m * K + k] * b[j * K + k];
          yr[j] = s;
        }
        continue;
      }
      memset(yr, 0, (size_t)N * sizeof(float));
      for (k = 0; k < K; ++k) {
        float av = a[m * K + k];
        for (j = 0; j < N; ++j) yr[j] += av * b[k * N + j];
      }
    }
  }
  return 0;
}

/* -- pooling: p = pool h w, stride h w, dilation h w, padding t l */
static int kiln_max_pool_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  const KilnJsonTensor *x = n->in_types[0], *y = &n->type;
  int64_t pad[4];
  if (kiln_attr_ints(a, "pool_size", 2, 1, &n->p[0]) ||
      kiln_attr_ints(a, "strides", 2, 1, &n->p[2]) ||
      kiln_attr_ints(a, "dilation", 2, 1, &n->p[4]) || kiln_attr_ints(a, "padding", 4, 0, pad))
    return -1;
  n->p[6] = pad[0];
  n->p[7] = pad[1];
  if (x->ndim != 4 || y->ndim != 4 || y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1])
    return kiln_bad_shapes(n, a, "x[N, C, H, W], out[N, C, OH, OW]");
  return 0;
}

static int kiln_max_pool_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  const int64_t* p = n->p;
  int64_t H = n->in_types[0]->shape[2], W = n->in_types[0]->shape[3];
  int64_t planes = n->type.shape[0] * n->type.shape[1], OH = n->type.shape[2];
  int64_t OW = n->type.shape[3], c, oh, ow, ki, kj;
  for (c = 0; c < planes; ++c) {
    const float* x = ins[0] + c * H * W;
    for (oh = 0; oh < OH; ++oh) {
      for (ow = 0; ow < OW; ++ow) {
        float m = -__builtin_inff();
        for (ki = 0; ki < p[0]; ++ki) {
          int64_t ih = oh * p[2] - p[6] + ki * p[4];
          if (ih < 0 || ih >= H) continue;
          for (kj = 0; kj < p[1]; ++kj) {
            int64_t iw = ow * p[3] - p[7] + kj * p[5];
            float v;
            if (iw < 0 || iw >= W) continue;
            v = x[ih * W + iw];
            if (v != v || v > m) m = v; /* np.max propagates NaN */
          }
        }
        out[(c * OH + oh) * OW + ow] = m;
      }
    }
  }
  return 0;
}

static int kiln_gap_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  const KilnJsonTensor *x = n->in_types[0], *y = &n->type;
  if (x->ndim != 4 || y->ndim != 4 || y->shape[0] != x->shape[0] ||
      y->shape[1] != x->shape[1] || y->shape[2] != 1 || y->shape[3] != 1)
    return kiln_bad_shapes(n, a, "x[N, C, H, W], out[N, C, 1, 1]");
  return 0;
}

static int kiln_gap_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  int64_t planes = n->type.size, hw = n->in_types[0]->shape[2] * n->in_types[0]->shape[3], c, i;
  for (c = 0; c < planes; ++c) {
    double s = 0.0;
    for (i = 0; i < hw; ++i) s += ins[0][c * hw + i];
    out[c] = (float)(s / (double)hw);
  }
  return 0;
}

/* -- concatenate (p = axis) and reshape */
static int kiln_concat_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  const KilnJsonTensor* y = &n->type;
  int64_t axis, sum = 0;
  int k, d;
  if (kiln_attr_int(a, "axis", -1, &axis) != 0) return -1;
  if (axis < -y->ndim || axis >= y->ndim) return kiln_bad_shapes(n, a, "an axis of the output");
  n->p[0] = axis = axis < 0 ? axis + y->ndim : axis;
  for (k = 0; k < n->num_inputs; ++k) {
    const KilnJsonTensor* x = n->in_types[k];
    if (x->ndim != y->ndim) return kiln_bad_shapes(n, a, "inputs of the output's rank");
    for (d = 0; d < y->ndim; ++d)
      if (d != axis && x->shape[d] != y->shape[d])
        return kiln_bad_shapes(n, a, "inputs equal off the axis");
    sum += x->shape[axis];
  }
  if (sum != y->shape[axis]) return kiln_bad_shapes(n, a, "the inputs' sum along the axis");
  return 0;
}

static int kiln_concat_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  int64_t outer = 1, inner = 1, o, off = 0;
  int d, k;
  for (d = 0; d < n->p[0]; ++d) outer *= n->type.shape[d];
  for (d = (int)n->p[0] + 1; d < n->type.ndim; ++d) inner *= n->type.shape[d];
  for (o = 0; o < outer; ++o) {
    for (k = 0; k < n->num_inputs; ++k) {
      int64_t chunk = n->in_types[k]->shape[n->p[0]] * inner;
      if (chunk) memcpy(out + off, ins[k] + o * chunk, (size_t)chunk * sizeof(float));
      off += chunk;
    }
  }
  return 0;
}

static int kiln_reshape_prepare(KilnJsonNode* n, const KilnJsonAttrs* a) {
  if (n->in_types[0]->size != n->type.size) return kiln_bad_shapes(n, a, "the same size");
  return 0;
}

static int kiln_reshape_run(const KilnJsonNode* n, const float* const* ins, float* out) {
  if (n->type.size) memmove(out, ins[0], (size_t)n->type.size * sizeof(float));
  return 0;
}

static const KilnJsonKernel kiln_json_kernels[] = {
    {"nn.conv2d", 2, 2, kiln_conv_prepare, kiln_conv_run},
    {"kiln_json.conv2d", 2, 3, kiln_conv_prepare, kiln_conv_run},
    {"kiln_json.conv2d_bias", 2, 3, kiln_conv_prepare, kiln_conv_run},
    {"kiln_json.conv2d_relu", 2, 3, kiln_conv_prepare, kiln_conv_run},
    {"kiln_json.conv2d_bias_relu", 2, 3, kiln_conv_prepare, kiln_conv_run},
    {"nn.dense", 2, 2, kiln_matmul_prepare, kiln_matmul_run},
    {"nn.matmul", 2, 2, kiln_matmul_prepare, kiln_matmul_run},
    {"nn.bias_add", 2, 2, kiln_bias_add_prepare, kiln_ew_run},
    {"add", 2, 2, kiln_add_prepare, kiln_ew_run},
    {"multiply", 2, 2, kiln_mul_prepare, kiln_ew_run},
    {"nn.relu", 1, 1, kiln_relu_prepare, kiln_ew_run},
    {"clip", 1, 1, kiln_clip_prepare, kiln_ew_run},
    {"nn.max_pool2d", 1, 1, kiln_max_pool_prepare, kiln_max_pool_run},
    {"nn.global_avg_pool2d", 1, 1, kiln_gap_prepare, kiln_gap_run},
    {"concatenate", 1, 1 << 20, kiln_concat_prepare, kiln_concat_run},
    {"reshape", 1, 1, kiln_reshape_prepare, kiln_reshape_run},
};

const KilnJsonKernel* kiln_json_kernel(const char* name, size_t len) {
  size_t i;
  for (i = 0; i < sizeof(kiln_json_kernels) / sizeof(kiln_json_kernels[0]); ++i)
    if (strlen(kiln_json_kernels[i].name) == len && memcmp(kiln_json_kernels[i].name, name, len) == 0)
      return &kiln_json_kernels[i];
  return NULL;
}

/*
 * Greedy text generation from C with libkiln_runtime (no Python): token ids in, token ids out.
 * Runs a decoder VM library (kiln.llm's interface: main(input_ids, attention_mask,
 * position_ids, past_key_values.{i}.key/value...) -> (logits, present.{i}.key/value...),
 * caches [past, batch, heads, head_dim]) the way kiln.llm.generate does for one prompt: the
 * prompt in one call (prefill), then one token per call, each the argmax of the last logits
 * row (the lowest id wins a tie, as numpy's argmax), the present caches fed back as the next
 * call's past. The C VM appends them in place (decision 019 / 022).
 *
 *     ./generate_vm_c model.so [--max-new-tokens N] [--stop ID]... PROMPT_ID...
 *
 * stdout: the new token ids on one line (a stop token ends the reply and is not printed);
 * stderr: the prefill's and the decode steps' wall-clock and CPU time. Exit status 0, 1 (the
 * runtime's error), 2 (usage, or a prompt id not below the vocabulary size, which the first
 * step's logits give). KILN_NUM_THREADS: kernel threads.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <kiln/runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CACHES 256 /* cache tensors: 2 per layer */
#define MAX_STOPS 16

/* main's inputs before the caches, in kiln.llm.Decoder's order */
static const char* const kStepInputs[3] = {"input_ids", "attention_mask", "position_ids"};

typedef struct {
  TVMModuleHandle exe, vm;
  TVMFunctionHandle main;
  int num_caches;
  int64_t heads, head_dim; /* of every cache tensor */
} Decoder;

/* Call `name` of `mod` with n arguments; the result goes to *ret / *code. */
static int call(TVMModuleHandle mod, const char* name, int n, TVMValue* args, int* codes,
                TVMValue* ret, int* code) {
  TVMFunctionHandle f;
  int rc;
  if (TVMModGetFunction(mod, name, 1, &f) != 0 || f == NULL) return -1;
  rc = TVMFuncCall(f, args, codes, n, ret, code);
  TVMFuncFree(f);
  return rc;
}

/* main's parameter `i`: its name or its shape text ("past,batch,3,64"), by `query`. */
static const char* param_text(Decoder* d, const char* query, int i) {
  TVMValue args[2], ret;
  int codes[2] = {kTVMStr, kTVMArgInt}, code;
  args[0].v_str = "main", args[1].v_int64 = i;
  return call(d->vm, query, 2, args, codes, &ret, &code) == 0 ? ret.v_str : NULL;
}

/* Load model.so, create its VM on the CPU and check main's signature: the three step inputs,
   then caches whose shapes end in static heads and head_dim. 0, or -1 (TVMGetLastError()
   says why). */
static int open_decoder(const char* path, Decoder* d) {
  char msg[512];
  TVMValue args[3], ret;
  int codes[3] = {kTVMArgInt, kTVMArgInt, kTVMArgInt}, code, n, i;
  const char* text;
  memset(d, 0, sizeof(*d));
  if (TVMModLoadFromFile(path, "so", &d->exe) != 0 ||
      call(d->exe, "vm_load_executable", 0, args, codes, &ret, &code) != 0)
    return -1;
  d->vm = ret.v_handle;
  args[0].v_int64 = kDLCPU, args[1].v_int64 = 0, args[2].v_int64 = 2; /* pooled allocator */
  if (call(d->vm, "vm_initialization", 3, args, codes, &ret, &code) != 0) return -1;
  args[0].v_str = "main", codes[0] = kTVMStr;
  if (call(d->vm, "get_function_arity", 1, args, codes, &ret, &code) != 0) return -1;
  n = (int)ret.v_int64;
  if (n < 3 || n - 3 > MAX_CACHES) {
    snprintf(msg, sizeof(msg), "main takes %d inputs, not a decoder's 3 + caches", n);
    TVMAPISetLastError(msg);
    return -1;
  }
  for (i = 0; i < 3; ++i) {
    if ((text = param_text(d, "get_function_param_name", i)) == NULL) return -1;
    if (strcmp(text, kStepInputs[i]) != 0) {
      snprintf(msg, sizeof(msg), "main's input %d is '%s', not a decoder's '%s'", i, text,
               kStepInputs[i]);
      TVMAPISetLastError(msg);
      return -1;
    }
  }
  d->num_caches = n - 3;
  for (i = 3; i < n; ++i) {
    long long heads = -1, head_dim = -1;
    const char* tail;
    if ((text = param_text(d, "get_function_param_shape", i)) == NULL) return -1;
    /* "past,batch,G,D": the two dims after the second comma */
    tail = strchr(text, ',');
    tail = tail ? strchr(tail + 1, ',') : NULL;
    if (tail == NULL || sscanf(tail, ",%lld,%lld", &heads, &head_dim) != 2 || heads <= 0 ||
        head_dim <= 0 || (i > 3 && (heads != d->heads || head_dim != d->head_dim))) {
      snprintf(msg, sizeof(msg), "main's input %d has shape [%s], not [past, batch, heads, "
               "head_dim] with the static heads and head_dim of the others", i, text);
      TVMAPISetLastError(msg);
      return -1;
    }
    d->heads = heads, d->head_dim = head_dim;
  }
  return TVMModGetFunction(d->vm, "main", 0, &d->main);
}

/* Item `k` of a step's result tuple (a tensor), or NULL. */
static DLTensor* item(void* tuple, int k) {
  TVMValue v;
  int code;
  return KilnTupleGetItem(tuple, k, &v, &code) == 0 && code == kTVMDLTensorHandle
             ? (DLTensor*)v.v_handle : NULL;
}

/* One step: main(ids, mask, pos, past...) -> *logits, and past[i] = the presents (tensors
   owned by the VM: the logits valid until its next call, the presents until the call after
   next, so they are fed back as they are). */
static int step(Decoder* d, DLTensor* ids, DLTensor* mask, DLTensor* pos, DLTensor** past,
                DLTensor** logits) {
  TVMValue args[3 + MAX_CACHES], ret;
  int codes[3 + MAX_CACHES], code, i;
  args[0].v_handle = ids, args[1].v_handle = mask, args[2].v_handle = pos;
  for (i = 0; i < d->num_caches; ++i) args[3 + i].v_handle = past[i];
  for (i = 0; i < 3 + d->num_caches; ++i) codes[i] = kTVMDLTensorHandle;
  if (TVMFuncCall(d->main, args, codes, 3 + d->num_caches, &ret, &code) != 0) return -1;
  if (code == kTVMObjectHandle && KilnTupleSize(ret.v_handle) == 1 + d->num_caches) {
    *logits = item(ret.v_handle, 0);
    for (i = 0; i < d->num_caches && (past[i] = item(ret.v_handle, 1 + i)) != NULL; ++i) {
    }
    if (*logits != NULL && i == d->num_caches) return 0;
  }
  TVMAPISetLastError("main did not return a tuple of tensors: logits, then the presents");
  return -1;
}

/* The greedy token: numpy's argmax over the last row of float32 logits [1, S, V] (the first
   maximum; a NaN counts as the maximum). -1 when logits is not such a tensor. */
static int64_t argmax_last(const DLTensor* logits) {
  const float* row;
  int64_t v, i, best = 0;
  if (logits == NULL || logits->ndim != 3 || logits->dtype.code != kDLFloat ||
      logits->dtype.bits != 32 || logits->shape[0] != 1 || logits->shape[1] < 1 ||
      (v = logits->shape[2]) < 1)
    return -1;
  row = (const float*)((const char*)logits->data + logits->byte_offset) +
        (logits->shape[1] - 1) * v;
  for (i = 0; i < v; ++i) {
    if (isnan(row[i])) return i;
    if (row[i] > row[best]) best = i;
  }
  return best;
}

static double now(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A [1, n] int64 array, 64-byte aligned (the VM then reads it in place). */
static DLTensor* ids_array(int64_t n) {
  int64_t shape[2] = {1, n};
  DLTensor* t = NULL;
  return TVMArrayAlloc(shape, 2, kDLInt, 64, 1, kDLCPU, 0, &t) == 0 ? t : NULL;
}

static int usage(const char* prog) {
  fprintf(stderr, "usage: %s model.so [--max-new-tokens N] [--stop ID]... PROMPT_ID...\n"
          "  greedy decoding: prints the new token ids (default N: 16); a --stop id ends the "
          "reply\n", prog);
  return 2;
}

/* A non-negative integer argument, or -1. */
static long long parse_id(const char* s) {
  char* end;
  long long v = strtoll(s, &end, 10);
  return end == s || *end || v < 0 ? -1 : v;
}

int main(int argc, char** argv) {
  Decoder d;
  DLTensor *prompt, *pos, *mask, *one_id, *one_pos, *empty = NULL, mask_view, *logits;
  DLTensor* past[MAX_CACHES];
  int64_t mask_shape[2] = {1, 0}, empty_shape[4] = {0, 1, 0, 0}, stops[MAX_STOPS], token;
  long long max_new = 16, num_prompt, steps, k, v;
  int num_stops = 0, i, a, stopped = 0;
  double wall[2] = {0, 0}, cpu[2] = {0, 0}, w0, c0;
  if (argc < 3) return usage(argv[0]);
  /* the options, then the prompt's ids */
  for (a = 2; a < argc && argv[a][0] == '-'; a += 2) {
    if (a + 1 >= argc || (v = parse_id(argv[a + 1])) < 0) return usage(argv[0]);
    if (strcmp(argv[a], "--max-new-tokens") == 0 && v >= 1) max_new = v;
    else if (strcmp(argv[a], "--stop") == 0 && num_stops < MAX_STOPS) stops[num_stops++] = v;
    else return usage(argv[0]);
  }
  if ((num_prompt = argc - a) < 1) return usage(argv[0]);
  for (i = a; i < argc; ++i)
    if (parse_id(argv[i]) < 0) return usage(argv[0]);
  if (open_decoder(argv[1], &d) != 0) {
    fprintf(stderr, "%s: %s\n", argv[1], TVMGetLastError());
    return 1;
  }
  prompt = ids_array(num_prompt), pos = ids_array(num_prompt);
  mask = ids_array(num_prompt + max_new), one_id = ids_array(1), one_pos = ids_array(1);
  empty_shape[2] = d.heads, empty_shape[3] = d.head_dim;
  if (!prompt || !pos || !mask || !one_id || !one_pos ||
      TVMArrayAlloc(empty_shape, 4, kDLFloat, 32, 1, kDLCPU, 0, &empty) != 0) {
    fprintf(stderr, "%s\n", TVMGetLastError());
    return 1;
  }
  for (k = 0; k < num_prompt; ++k)
    ((int64_t*)prompt->data)[k] = parse_id(argv[a + k]), ((int64_t*)pos->data)[k] = k;
  for (k = 0; k < num_prompt + max_new; ++k) ((int64_t*)mask->data)[k] = 1;
  /* attention_mask spans past + sequence: a view of the first columns of `mask` */
  mask_view = *mask, mask_view.shape = mask_shape;
  for (i = 0; i < d.num_caches; ++i) past[i] = empty;
  /* step k: the prompt (k = 0) or the token of step k - 1 at position num_prompt + k - 1 */
  for (k = 0; k < max_new && !stopped; ++k) {
    int first = k == 0;
    mask_shape[1] = num_prompt + k;
    ((int64_t*)one_pos->data)[0] = num_prompt + k - 1;
    w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    if (step(&d, first ? prompt : one_id, &mask_view, first ? pos : one_pos, past,
             &logits) != 0) {
      fprintf(stderr, "step %lld: %s\n", k, TVMGetLastError());
      return 1;
    }
    wall[!first] += now(CLOCK_MONOTONIC) - w0;
    cpu[!first] += now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if ((token = argmax_last(logits)) < 0) {
      fprintf(stderr, "step %lld: the logits are not float32 [1, sequence, vocab]\n", k);
      return 1;
    }
    /* the model clamps an id past its vocabulary (Gather's "clip" mode): refuse it instead */
    for (v = 0; first && v < num_prompt; ++v) {
      if (((int64_t*)prompt->data)[v] >= logits->shape[2]) {
        fprintf(stderr, "prompt id %lld (position %lld) is not below the vocabulary size "
                "%lld\n", (long long)((int64_t*)prompt->data)[v], v,
                (long long)logits->shape[2]);
        return 2;
      }
    }
    for (i = 0; i < num_stops; ++i) stopped |= token == stops[i];
    if (!stopped) printf(k ? " %lld" : "%lld", (long long)token);
    ((int64_t*)one_id->data)[0] = token;
  }
  printf("\n");
  steps = k - 1; /* the decode steps: those after the prompt's */
  fprintf(stderr, "prefill: %lld tokens, %.1f ms (CPU %.1f ms); decode: %lld steps, %.1f ms "
          "(CPU %.1f ms), %.2f tokens/s\n", num_prompt, 1e3 * wall[0], 1e3 * cpu[0], steps,
          1e3 * wall[1], 1e3 * cpu[1], wall[1] > 0 ? (double)steps / wall[1] : 0.0);
  TVMArrayFree(prompt), TVMArrayFree(pos), TVMArrayFree(mask), TVMArrayFree(one_id);
  TVMArrayFree(one_pos), TVMArrayFree(empty);
  TVMFuncFree(d.main);
  TVMModFree(d.vm);
  TVMModFree(d.exe);
  return 0;
}

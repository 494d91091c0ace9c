/*
 * Run a Kiln VM library (a model with symbolic dims, e.g. a dynamic batch) from C with
 * libkiln_runtime (no Python): load model.so, create a VM on the CPU, build main's inputs at the
 * shapes given on the command line from raw files, call main, print its outputs and write each
 * to OUT<k>.bin.
 *
 *     ./deploy_vm_c model.so OUT SHAPE:FILE...     one per input of main, in its order
 *     ./deploy_vm_c model.so out 2x3x224x224:x.bin
 */
#include <kiln/runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUTS 16
#define MAX_NDIM 16

#define CHECK(call)                                                  \
  do {                                                               \
    if ((call) != 0) {                                               \
      fprintf(stderr, "%s failed: %s\n", #call, TVMGetLastError());  \
      return 1;                                                      \
    }                                                                \
  } while (0)

/* Call `name` of `mod` with n arguments; the result goes to *ret / *code. */
static int call(TVMModuleHandle mod, const char* name, int n, TVMValue* args, int* codes,
                TVMValue* ret, int* code) {
  TVMFunctionHandle f;
  int rc;
  if (TVMModGetFunction(mod, name, 1, &f) != 0) return -1;
  if (f == NULL) return -1; /* TVMGetLastError() says why */
  rc = TVMFuncCall(f, args, codes, n, ret, code);
  TVMFuncFree(f);
  return rc;
}

/* "2x3x224x224:x.bin" -> dims, *ndim and *file; -1 when malformed. */
static int parse_input(const char* arg, int64_t* dims, int* ndim, const char** file) {
  const char* p = arg;
  for (*ndim = 0; *ndim < MAX_NDIM;) {
    char* end;
    long long d = strtoll(p, &end, 10);
    if (end == p || d < 0) return -1;
    dims[(*ndim)++] = d;
    if (*end == ':') {
      *file = end + 1;
      return **file ? 0 : -1;
    }
    if (*end != 'x') return -1;
    p = end + 1;
  }
  return -1;
}

/* Fill t from `path`, which must hold exactly t's bytes. */
static int read_input(const char* path, DLTensor* t) {
  size_t nbytes = KilnArrayNumBytes(t);
  FILE* f = fopen(path, "rb");
  int ok = f != NULL && fread(t->data, 1, nbytes, f) == nbytes && fgetc(f) == EOF;
  if (f) fclose(f);
  if (!ok) fprintf(stderr, "%s must hold exactly %zu bytes (the input's shape)\n", path, nbytes);
  return ok ? 0 : -1;
}

static const char* dtype_name(DLDataType t) {
  static char buf[32];
  const char* kind = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : "uint";
  snprintf(buf, sizeof(buf), "%s%d", kind, t.bits);
  return buf;
}

/* Print output k (dtype, shape; float32: each row's first values and its best index) and
   write its bytes to <prefix><k>.bin. */
static int print_output(int k, const DLTensor* y, const char* prefix) {
  size_t nbytes = KilnArrayNumBytes(y), row, rows, cols, i;
  char path[1024];
  FILE* f;
  int d;
  printf("output %d: %s [", k, dtype_name(y->dtype));
  for (d = 0; d < y->ndim; ++d) printf(d ? ", %lld" : "%lld", (long long)y->shape[d]);
  printf("]\n");
  if (y->dtype.code == kDLFloat && y->dtype.bits == 32 && y->ndim > 0 && nbytes > 0) {
    const float* p = (const float*)y->data;
    rows = (size_t)y->shape[0];
    cols = nbytes / 4 / rows;
    for (row = 0; row < rows; ++row, p += cols) {
      size_t best = 0;
      printf("  row %zu:", row);
      for (i = 0; i < cols; ++i) {
        if (i < 8) printf(" %.6g", p[i]);
        if (p[i] > p[best]) best = i;
      }
      printf("%s (best %zu)\n", cols > 8 ? " ..." : "", best);
    }
  }
  snprintf(path, sizeof(path), "%s%d.bin", prefix, k);
  if ((f = fopen(path, "wb")) == NULL || fwrite(y->data, 1, nbytes, f) != nbytes) {
    fprintf(stderr, "cannot write %s\n", path);
    if (f) fclose(f);
    return -1;
  }
  fclose(f);
  return 0;
}

int main(int argc, char** argv) {
  TVMModuleHandle exe, vm;
  TVMValue args[MAX_INPUTS], ret;
  int codes[MAX_INPUTS], code, n, k, rc = 0;
  DLTensor* inputs[MAX_INPUTS] = {NULL};
  if (argc < 3) {
    fprintf(stderr, "usage: %s model.so OUT SHAPE:FILE...  (e.g. 2x3x224x224:x.bin)\n", argv[0]);
    return 2;
  }
  /* 1. load the library: the root module is the VM executable (relax.VMExecutable) */
  CHECK(TVMModLoadFromFile(argv[1], "so", &exe));
  /* 2. create a VM and initialize it on the CPU: exe["vm_load_executable"](), then
        vm["vm_initialization"](kDLCPU, 0, 2): device type, device id, pooled allocator */
  CHECK(call(exe, "vm_load_executable", 0, args, codes, &ret, &code));
  vm = ret.v_handle;
  args[0].v_int64 = kDLCPU, args[1].v_int64 = 0, args[2].v_int64 = 2;
  codes[0] = codes[1] = codes[2] = kTVMArgInt;
  CHECK(call(vm, "vm_initialization", 3, args, codes, &ret, &code));
  /* 3. main's signature: how many inputs, and each one's name and dtype */
  args[0].v_str = "main";
  codes[0] = kTVMStr;
  CHECK(call(vm, "get_function_arity", 1, args, codes, &ret, &code));
  n = (int)ret.v_int64;
  if (n > MAX_INPUTS || argc - 3 != n) {
    fprintf(stderr, "main takes %d inputs; give SHAPE:FILE for each:", n);
    for (k = 0; k < n; ++k) {
      args[0].v_str = "main", args[1].v_int64 = k;
      codes[0] = kTVMStr, codes[1] = kTVMArgInt;
      CHECK(call(vm, "get_function_param_name", 2, args, codes, &ret, &code));
      fprintf(stderr, " %s", ret.v_str);
    }
    fprintf(stderr, "\n");
    return 2;
  }
  /* 4. the inputs, at the shapes the command line gives (the VM checks them against the
        model's symbols), with main's dtypes */
  for (k = 0; k < n; ++k) {
    int64_t dims[MAX_NDIM];
    int ndim;
    const char* file;
    DLDataType dt;
    if (parse_input(argv[3 + k], dims, &ndim, &file) != 0) {
      fprintf(stderr, "input %d: expected SHAPE:FILE such as 2x3x224x224:x.bin, got %s\n", k,
              argv[3 + k]);
      return 2;
    }
    args[0].v_str = "main", args[1].v_int64 = k;
    codes[0] = kTVMStr, codes[1] = kTVMArgInt;
    CHECK(call(vm, "get_function_param_dtype", 2, args, codes, &ret, &code));
    dt = ret.v_type;
    CHECK(TVMArrayAlloc(dims, ndim, dt.code, dt.bits, dt.lanes, kDLCPU, 0, &inputs[k]));
    if (read_input(file, inputs[k]) != 0) return 1;
  }
  /* 5. main(inputs...): one tensor, or a tuple of them; both owned by the VM and valid until
        its next call */
  for (k = 0; k < n; ++k) {
    args[k].v_handle = inputs[k];
    codes[k] = kTVMDLTensorHandle;
  }
  CHECK(call(vm, "main", n, args, codes, &ret, &code));
  if (code == kTVMDLTensorHandle) {
    rc = print_output(0, (const DLTensor*)ret.v_handle, argv[2]);
  } else if (code == kTVMObjectHandle) {
    void* tuple = ret.v_handle;
    for (k = 0; k < KilnTupleSize(tuple) && rc == 0; ++k) {
      CHECK(KilnTupleGetItem(tuple, k, &ret, &code));
      if (code == kTVMDLTensorHandle) rc = print_output(k, (const DLTensor*)ret.v_handle, argv[2]);
      else printf("output %d: not a tensor (type code %d)\n", k, code);
    }
  }
  for (k = 0; k < n; ++k) TVMArrayFree(inputs[k]);
  TVMModFree(vm);
  TVMModFree(exe);
  return rc ? 1 : 0;
}

/*
 * A tiny C driver for cross-compiled Kiln kernel libraries (tests/backend/codegen/test_cross.py): no
 * Python on the target. Usage: harness LIB.so FUNC SPEC. SPEC has one line per packed argument,
 * inputs then outputs: "in|out PATH DTYPE_CODE DTYPE_BITS NDIM DIM0 DIM1 ...". Inputs are read
 * from PATH (raw little-endian bytes), outputs written there after the call. Tensors are
 * 64-byte aligned, as Kiln's kernels require.
 */
#include <dlfcn.h>
#include <kiln/c_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 16

typedef int32_t (*packed_fn)(TVMValue*, int32_t*, int32_t, TVMValue*, int32_t*, void*);

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s LIB FUNC SPEC\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  packed_fn fn = (packed_fn)dlsym(lib, argv[2]);
  const char* (*last_error)(void) = (const char* (*)(void))dlsym(lib, "TVMGetLastError");
  if (fn == NULL || last_error == NULL) {
    fprintf(stderr, "dlsym %s: %s\n", argv[2], dlerror());
    return 2;
  }
  FILE* spec = fopen(argv[3], "r");
  if (spec == NULL) {
    perror(argv[3]);
    return 2;
  }
  DLTensor tensors[MAX_ARGS];
  int64_t shapes[MAX_ARGS][8];
  char paths[MAX_ARGS][512];
  int is_out[MAX_ARGS];
  size_t nbytes[MAX_ARGS];
  TVMValue values[MAX_ARGS];
  int32_t codes[MAX_ARGS];
  int n = 0;
  char kind[8];
  int code, bits, ndim;
  while (n < MAX_ARGS &&
         fscanf(spec, "%7s %511s %d %d %d", kind, paths[n], &code, &bits, &ndim) == 5) {
    DLTensor* t = &tensors[n];
    memset(t, 0, sizeof(*t));
    size_t count = 1;
    for (int d = 0; d < ndim && d < 8; ++d) {
      long long dim;
      if (fscanf(spec, "%lld", &dim) != 1) return 2;
      shapes[n][d] = dim;
      count *= (size_t)dim;
    }
    nbytes[n] = count * (size_t)(bits / 8);
    t->data = aligned_alloc(64, (nbytes[n] + 63) / 64 * 64 + 64);
    t->device.device_type = kDLCPU;
    t->ndim = ndim;
    t->dtype.code = (uint8_t)code;
    t->dtype.bits = (uint8_t)bits;
    t->dtype.lanes = 1;
    t->shape = shapes[n];
    is_out[n] = strcmp(kind, "out") == 0;
    if (!is_out[n]) {
      FILE* f = fopen(paths[n], "rb");
      if (f == NULL || fread(t->data, 1, nbytes[n], f) != nbytes[n]) {
        fprintf(stderr, "cannot read %s\n", paths[n]);
        return 2;
      }
      fclose(f);
    }
    values[n].v_handle = t;
    codes[n] = kTVMDLTensorHandle;
    ++n;
  }
  fclose(spec);
  TVMValue ret;
  int32_t ret_code = kTVMNullptr;
  if (fn(values, codes, n, &ret, &ret_code, NULL) != 0) {
    fprintf(stderr, "%s failed: %s\n", argv[2], last_error());
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    if (!is_out[i]) continue;
    FILE* f = fopen(paths[i], "wb");
    if (f == NULL || fwrite(tensors[i].data, 1, nbytes[i], f) != nbytes[i]) {
      fprintf(stderr, "cannot write %s\n", paths[i]);
      return 2;
    }
    fclose(f);
  }
  printf("%s ok\n", argv[2]);
  return 0;
}

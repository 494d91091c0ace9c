/*
 * Run a Kiln model from C with libkiln_runtime (no Python): load model.so, feed its first input
 * from a raw file, run, write its first output and print the best class.
 *
 *     ./deploy_c model.so input.bin output.bin
 */
#include <kiln/runtime.h>
#include <stdio.h>
#include <stdlib.h>

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
  if (f == NULL) return -1; /* TVMGetLastError() says why (a VM library has no "default") */
  rc = TVMFuncCall(f, args, codes, n, ret, code);
  TVMFuncFree(f);
  return rc;
}

int main(int argc, char** argv) {
  TVMModuleHandle factory, gm;
  TVMValue args[2], ret;
  int codes[2], code;
  DLTensor *x, *y;
  const DLTensor* info;
  size_t nbytes, i, best = 0;
  void* buf;
  FILE* f;
  if (argc != 4) {
    fprintf(stderr, "usage: %s model.so input.bin output.bin\n", argv[0]);
    return 2;
  }
  /* 1. load the library: the root module is the graph executor factory */
  CHECK(TVMModLoadFromFile(argv[1], "so", &factory));
  /* 2. create a graph executor on the CPU: factory["default"](cpu(0)) */
  args[0].v_device.device_type = kDLCPU;
  args[0].v_device.device_id = 0;
  codes[0] = kDLDeviceArg;
  CHECK(call(factory, "default", 1, args, codes, &ret, &code));
  gm = ret.v_handle;
  /* 3. an input tensor shaped like input 0 (get_input returns the executor's own tensor) */
  args[0].v_int64 = 0;
  codes[0] = kTVMArgInt;
  CHECK(call(gm, "get_input", 1, args, codes, &ret, &code));
  info = (const DLTensor*)ret.v_handle;
  CHECK(TVMArrayAlloc(info->shape, info->ndim, info->dtype.code, info->dtype.bits,
                      info->dtype.lanes, kDLCPU, 0, &x));
  nbytes = KilnArrayNumBytes(x);
  buf = malloc(nbytes);
  if ((f = fopen(argv[2], "rb")) == NULL || fread(buf, 1, nbytes, f) != nbytes) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", nbytes, argv[2]);
    return 1;
  }
  fclose(f);
  CHECK(TVMArrayCopyFromBytes(x, buf, nbytes));
  free(buf);
  /* 4. set_input(0, x); run() */
  args[0].v_int64 = 0;
  codes[0] = kTVMArgInt;
  args[1].v_handle = x;
  codes[1] = kTVMDLTensorHandle;
  CHECK(call(gm, "set_input", 2, args, codes, &ret, &code));
  CHECK(call(gm, "run", 0, args, codes, &ret, &code));
  /* 5. get_output(0, y): copied into our own array */
  args[0].v_int64 = 0;
  codes[0] = kTVMArgInt;
  CHECK(call(gm, "get_output", 1, args, codes, &ret, &code));
  info = (const DLTensor*)ret.v_handle;
  CHECK(TVMArrayAlloc(info->shape, info->ndim, info->dtype.code, info->dtype.bits,
                      info->dtype.lanes, kDLCPU, 0, &y));
  args[1].v_handle = y;
  codes[1] = kTVMDLTensorHandle;
  CHECK(call(gm, "get_output", 2, args, codes, &ret, &code));
  nbytes = KilnArrayNumBytes(y);
  if ((f = fopen(argv[3], "wb")) == NULL || fwrite(y->data, 1, nbytes, f) != nbytes) {
    fprintf(stderr, "cannot write %s\n", argv[3]);
    return 1;
  }
  fclose(f);
  if (y->dtype.code == kDLFloat && y->dtype.bits == 32) {
    const float* p = (const float*)y->data;
    for (i = 1; i < nbytes / 4; ++i)
      if (p[i] > p[best]) best = i;
    printf("best class: %zu (score %g)\n", best, p[best]);
  }
  TVMArrayFree(x);
  TVMArrayFree(y);
  TVMModFree(gm);
  TVMModFree(factory);
  return 0;
}

/*
 * The VM through libkiln_runtime's C API (tests/backend/native/test_native_vm.py builds it under ASan +
 * UBSan): native_vm_test TINY.so NONZERO.so
 *
 * TINY.so: main(x: float32[n, 4]) -> (relu(x + [1, -2, 3, -4]), x * x), a VM library.
 * NONZERO.so: main(x) -> NonZero(x), which needs a builtin the native VM does not implement.
 * Checks the errors (call before vm_initialization, a bad device, wrong argument count, dtype
 * and dim, the unimplemented builtin named), the signature queries, the tuple result, storage
 * growing and shrinking across calls, and a misaligned input (staged). Prints "ok".
 */
#include <kiln/runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, TVMGetLastError());                                             \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#define EXPECT_ERROR(call, text)                                                          \
  do {                                                                                    \
    CHECK((call) != 0);                                                                   \
    if (strstr(TVMGetLastError(), text) == NULL) {                                        \
      fprintf(stderr, "%s:%d: error '%s' lacks '%s'\n", __FILE__, __LINE__,               \
              TVMGetLastError(), text);                                                   \
      exit(1);                                                                            \
    }                                                                                     \
    printf("error as expected: %s\n", TVMGetLastError());                                \
  } while (0)

static TVMFunctionHandle get(TVMModuleHandle m, const char* name) {
  TVMFunctionHandle f = NULL;
  CHECK(TVMModGetFunction(m, name, 0, &f) == 0 && f != NULL);
  return f;
}

static TVMModuleHandle load_vm(const char* path) {
  TVMModuleHandle exe, vm;
  TVMFunctionHandle f;
  TVMValue ret;
  int code;
  CHECK(TVMModLoadFromFile(path, "so", &exe) == 0);
  CHECK(strcmp(KilnModTypeKey(exe), "relax.VMExecutable") == 0);
  f = get(exe, "vm_load_executable");
  CHECK(TVMFuncCall(f, NULL, NULL, 0, &ret, &code) == 0 && code == kTVMModuleHandle);
  vm = ret.v_handle;
  CHECK(strcmp(KilnModTypeKey(vm), "relax.VirtualMachine") == 0);
  TVMFuncFree(f);
  TVMModFree(exe); /* the VM keeps it */
  return vm;
}

static int init(TVMModuleHandle vm, int64_t device_type) {
  TVMFunctionHandle f = get(vm, "vm_initialization");
  TVMValue args[3], ret;
  int codes[3] = {kTVMArgInt, kTVMArgInt, kTVMArgInt}, code, rc;
  args[0].v_int64 = device_type, args[1].v_int64 = 0, args[2].v_int64 = 2;
  rc = TVMFuncCall(f, args, codes, 3, &ret, &code);
  TVMFuncFree(f);
  return rc;
}

/* main(x) on a tensor of n rows (data at byte offset `offset` of its buffer), checked. */
static void run_tiny(TVMFunctionHandle main_fn, int64_t n, size_t offset) {
  static const float c[4] = {1, -2, 3, -4};
  int64_t shape[2] = {n, 4};
  DLTensor* x;
  TVMValue arg, ret, item;
  int code = kTVMDLTensorHandle, ret_code, k, i;
  float* data;
  CHECK(TVMArrayAlloc(shape, 2, kDLFloat, 32, 1, kDLCPU, 0, &x) == 0);
  free(x->data);
  x->data = calloc(1, (size_t)(n * 4) * sizeof(float) + offset + 64);
  x->byte_offset = offset;
  data = (float*)((char*)x->data + offset);
  for (i = 0; i < n * 4; ++i) data[i] = (float)(i % 7) - 3.0f;
  arg.v_handle = x;
  CHECK(TVMFuncCall(main_fn, &arg, &code, 1, &ret, &ret_code) == 0);
  CHECK(ret_code == kTVMObjectHandle && KilnTupleSize(ret.v_handle) == 2);
  for (k = 0; k < 2; ++k) {
    const DLTensor* y;
    CHECK(KilnTupleGetItem(ret.v_handle, k, &item, &code) == 0 && code == kTVMDLTensorHandle);
    y = (const DLTensor*)item.v_handle;
    CHECK(y->ndim == 2 && y->shape[0] == n && y->shape[1] == 4 && y->dtype.code == kDLFloat);
    for (i = 0; i < n * 4; ++i) {
      float want = k == 0 ? fmaxf(data[i] + c[i % 4], 0.0f) : data[i] * data[i];
      CHECK(fabsf(((const float*)y->data)[i] - want) < 1e-6f);
    }
  }
  EXPECT_ERROR(KilnTupleGetItem(ret.v_handle, 2, &item, &code), "out of range");
  TVMArrayFree(x);
}

int main(int argc, char** argv) {
  TVMModuleHandle vm, nz;
  TVMFunctionHandle main_fn, f;
  TVMValue args[2], ret;
  int codes[2], code;
  int64_t shape[2] = {3, 4}, bad_shape[2] = {3, 5};
  DLTensor *x, *xi;
  if (argc != 3) {
    fprintf(stderr, "usage: native_vm_test TINY.so NONZERO.so\n");
    return 2;
  }
  vm = load_vm(argv[1]);
  main_fn = get(vm, "main");
  CHECK(TVMArrayAlloc(shape, 2, kDLFloat, 32, 1, kDLCPU, 0, &x) == 0);
  CHECK(TVMArrayAlloc(shape, 2, kDLInt, 64, 1, kDLCPU, 0, &xi) == 0);
  args[0].v_handle = x;
  codes[0] = kTVMDLTensorHandle;
  EXPECT_ERROR(TVMFuncCall(main_fn, args, codes, 1, &ret, &code), "vm_initialization");
  EXPECT_ERROR(init(vm, 2), "device type 2");
  CHECK(init(vm, kDLCPU) == 0);
  /* signature queries */
  args[0].v_str = "main";
  codes[0] = kTVMStr;
  f = get(vm, "get_function_arity");
  CHECK(TVMFuncCall(f, args, codes, 1, &ret, &code) == 0 && ret.v_int64 == 1);
  TVMFuncFree(f);
  f = get(vm, "get_function_param_name");
  args[1].v_int64 = 0;
  codes[1] = kTVMArgInt;
  CHECK(TVMFuncCall(f, args, codes, 2, &ret, &code) == 0 && strcmp(ret.v_str, "x") == 0);
  args[1].v_int64 = 1;
  EXPECT_ERROR(TVMFuncCall(f, args, codes, 2, &ret, &code), "index below 1");
  TVMFuncFree(f);
  f = get(vm, "get_function_param_dtype");
  args[1].v_int64 = 0;
  CHECK(TVMFuncCall(f, args, codes, 2, &ret, &code) == 0 && code == kTVMDataType &&
        ret.v_type.code == kDLFloat && ret.v_type.bits == 32);
  TVMFuncFree(f);
  /* argument errors */
  EXPECT_ERROR(TVMFuncCall(main_fn, args, codes, 0, &ret, &code), "takes 1 inputs (x), got 0");
  args[0].v_handle = xi;
  codes[0] = kTVMDLTensorHandle;
  EXPECT_ERROR(TVMFuncCall(main_fn, args, codes, 1, &ret, &code), "input 'x': expected dtype");
  TVMArrayFree(xi);
  CHECK(TVMArrayAlloc(bad_shape, 2, kDLFloat, 32, 1, kDLCPU, 0, &xi) == 0);
  args[0].v_handle = xi;
  EXPECT_ERROR(TVMFuncCall(main_fn, args, codes, 1, &ret, &code), "dim 1: expected 4 but got 5");
  TVMArrayFree(xi);
  args[0].v_int64 = 3;
  codes[0] = kTVMArgInt;
  EXPECT_ERROR(TVMFuncCall(main_fn, args, codes, 1, &ret, &code), "must be a tensor");
  /* results: storage grows (3 -> 50 rows) and is reused (2 rows); a misaligned input */
  run_tiny(main_fn, 3, 0);
  run_tiny(main_fn, 50, 0);
  run_tiny(main_fn, 2, 4);
  run_tiny(main_fn, 1, 0);
  { /* a result fed back as the input: relu(y + c) and y * y of the old y */
    TVMValue r, item;
    int rc2, c2 = kTVMDLTensorHandle;
    float y0[8];
    DLTensor* y;
    CHECK(TVMArrayAlloc((int64_t[]){2, 4}, 2, kDLFloat, 32, 1, kDLCPU, 0, &xi) == 0);
    for (int i = 0; i < 8; ++i) ((float*)xi->data)[i] = (float)i - 4.0f;
    args[0].v_handle = xi;
    CHECK(TVMFuncCall(main_fn, args, &c2, 1, &r, &rc2) == 0);
    CHECK(KilnTupleGetItem(r.v_handle, 0, &item, &c2) == 0);
    y = (DLTensor*)item.v_handle;
    memcpy(y0, y->data, sizeof(y0));
    args[0].v_handle = y;
    c2 = kTVMDLTensorHandle;
    CHECK(TVMFuncCall(main_fn, args, &c2, 1, &r, &rc2) == 0);
    CHECK(KilnTupleGetItem(r.v_handle, 1, &item, &c2) == 0);
    for (int i = 0; i < 8; ++i)
      CHECK(((float*)((DLTensor*)item.v_handle)->data)[i] == y0[i] * y0[i]);
    TVMArrayFree(xi);
  }
  CHECK(init(vm, kDLCPU) == 0); /* again: the call sites are prepared anew */
  run_tiny(main_fn, 4, 4);
  TVMArrayFree(x);
  TVMFuncFree(main_fn);
  TVMModFree(vm);
  /* a builtin the native VM does not implement: named at vm_initialization */
  nz = load_vm(argv[2]);
  EXPECT_ERROR(init(nz, kDLCPU), "builtin 'vm.builtin.unique'");
  f = get(nz, "main");
  args[0].v_handle = NULL;
  codes[0] = kTVMDLTensorHandle;
  EXPECT_ERROR(TVMFuncCall(f, args, codes, 1, &ret, &code), "vm_initialization");
  TVMFuncFree(f);
  TVMModFree(nz);
  printf("ok\n");
  return 0;
}

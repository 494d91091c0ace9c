/*
 * libkiln_runtime's C API on the libraries tests/backend/native/test_native_api.py exports:
 *
 *   native_api_test graph model.so params.bin   the corpus graph (x, y, p0: out = (x+y)*p0+x)
 *   native_api_test const consts.so             a const_loader module in front of the kernels
 *
 * Each check prints "ok <what>" or "FAIL <what>: <message>" (exit 1 at the first failure).
 */
#include <kiln/runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      printf("FAIL %s: %s\n", what, TVMGetLastError());                     \
      exit(1);                                                              \
    }                                                                       \
    printf("ok %s\n", what);                                                \
  } while (0)

static TVMValue ret;
static int code;

/* Call mod[name] with up to two arguments given as (value, code) pairs. */
static int call(TVMModuleHandle mod, const char* name, int n, TVMValue a0, int c0, TVMValue a1,
                int c1) {
  TVMFunctionHandle f = NULL;
  TVMValue args[2] = {a0, a1};
  int codes[2] = {c0, c1}, rc;
  if (TVMModGetFunction(mod, name, 1, &f) != 0 || f == NULL) return -2;
  rc = TVMFuncCall(f, args, codes, n, &ret, &code);
  TVMFuncFree(f);
  return rc;
}

static TVMValue I(int64_t v) { TVMValue x; x.v_int64 = v; return x; }
static TVMValue S(const char* v) { TVMValue x; x.v_str = v; return x; }
static TVMValue H(void* v) { TVMValue x; x.v_handle = v; return x; }

static DLTensor* tensor23(float first) {
  int64_t shape[2] = {2, 3};
  DLTensor* t;
  float v[6];
  int i;
  for (i = 0; i < 6; ++i) v[i] = first + (float)i;
  if (TVMArrayAlloc(shape, 2, kDLFloat, 32, 1, kDLCPU, 0, &t) != 0) return NULL;
  TVMArrayCopyFromBytes(t, v, sizeof(v));
  return t;
}

static int out_is(TVMModuleHandle gm, const float* want) {
  const float* y;
  int i;
  if (call(gm, "get_output", 1, I(0), kTVMArgInt, I(0), 0) != 0) return 0;
  y = (const float*)((DLTensor*)ret.v_handle)->data;
  for (i = 0; i < 6; ++i)
    if (y[i] != want[i]) {
      printf("  output[%d] = %g, want %g\n", i, y[i], want[i]);
      return 0;
    }
  return 1;
}

static int graph(const char* so, const char* params_path) {
  TVMModuleHandle fac, gm, lib;
  TVMFunctionHandle g = NULL;
  DLTensor *x = tensor23(1), *y = tensor23(10), *bad, *out;
  float want[6], vals[6];
  int64_t shape3[1] = {3};
  char* params;
  long n;
  FILE* f;
  int i;
  CHECK(TVMModLoadFromFile(so, "so", &fac) == 0, "load");
  CHECK(strcmp(KilnModTypeKey(fac), "GraphExecutorFactory") == 0, "root is the factory");
  CHECK(call(fac, "get_lib", 0, I(0), 0, I(0), 0) == 0 && code == kTVMModuleHandle &&
            strcmp(KilnModTypeKey(ret.v_handle), "library") == 0, "get_lib");
  lib = ret.v_handle;
  CHECK(TVMModImport(lib, fac) != 0 && strstr(TVMGetLastError(), "cycle"), "import cycle refused");
  TVMModFree(lib);
  CHECK(call(fac, "get_graph_json", 0, I(0), 0, I(0), 0) == 0 && code == kTVMStr &&
            strstr(ret.v_str, "fused_mul") != NULL, "get_graph_json");
  CHECK(call(fac, "default", 1, I(kDLCPU), kTVMArgInt, I(0), 0) == 0, "default(cpu)");
  gm = ret.v_handle;
  CHECK(call(gm, "get_num_inputs", 0, I(0), 0, I(0), 0) == 0 && ret.v_int64 == 2,
        "get_num_inputs excludes params");
  CHECK(call(gm, "get_input_index", 1, S("p0"), kTVMStr, I(0), 0) == 0 && ret.v_int64 == 2,
        "get_input_index of a param: after the inputs");
  CHECK(call(gm, "get_input_name", 1, I(1), kTVMArgInt, I(0), 0) == 0 &&
            strcmp(ret.v_str, "y") == 0, "get_input_name");
  CHECK(call(gm, "set_input", 2, S("x"), kTVMStr, H(x), kTVMDLTensorHandle) == 0 &&
            call(gm, "set_input", 2, I(1), kTVMArgInt, H(y), kTVMDLTensorHandle) == 0,
        "set_input by name and index");
  CHECK(call(gm, "run", 0, I(0), 0, I(0), 0) == 0, "run");
  for (i = 0; i < 6; ++i) want[i] = (float)((1 + i + 10 + i) * i + 1 + i); /* p0 = arange */
  CHECK(out_is(gm, want), "output (x+y)*p0+x");
  /* zero-copy: the executor reads x's memory at each run */
  CHECK(call(gm, "set_input_zero_copy", 2, S("x"), kTVMStr, H(x), kTVMDLTensorHandle) == 0,
        "set_input_zero_copy");
  ((float*)x->data)[0] = 100;
  call(gm, "run", 0, I(0), 0, I(0), 0);
  want[0] = (float)((100 + 10) * 0 + 100);
  CHECK(out_is(gm, want), "zero-copy input seen by run");
  {
    DLTensor unaligned = *x;
    unaligned.byte_offset = 4;
    CHECK(call(gm, "set_input_zero_copy", 2, S("x"), kTVMStr, H(&unaligned),
               kTVMDLTensorHandle) != 0 && strstr(TVMGetLastError(), "aligned"),
          "zero-copy refuses unaligned memory");
  }
  CHECK(TVMArrayAlloc(shape3, 1, kDLFloat, 32, 1, kDLCPU, 0, &bad) == 0, "TVMArrayAlloc");
  CHECK(call(gm, "set_input", 2, S("x"), kTVMStr, H(bad), kTVMDLTensorHandle) != 0 &&
            strstr(TVMGetLastError(), "rank"), "set_input refuses another shape");
  CHECK(call(gm, "set_input", 2, S("nope"), kTVMStr, H(x), kTVMDLTensorHandle) != 0 &&
            strstr(TVMGetLastError(), "no input named 'nope'"), "set_input unknown name");
  /* set_input copies again (ends the binding) */
  ((float*)x->data)[0] = 1;
  call(gm, "set_input", 2, S("x"), kTVMStr, H(x), kTVMDLTensorHandle);
  ((float*)x->data)[0] = 555;
  call(gm, "run", 0, I(0), 0, I(0), 0);
  want[0] = 1;
  CHECK(out_is(gm, want), "set_input after zero-copy copies");
  /* load_params: p0 = 2 everywhere */
  f = fopen(params_path, "rb");
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  params = (char*)malloc((size_t)n);
  if (fread(params, 1, (size_t)n, f) != (size_t)n) return 1;
  fclose(f);
  {
    TVMByteArray bytes = {params, (size_t)n};
    CHECK(call(gm, "load_params", 1, H(&bytes), kTVMBytes, I(0), 0) == 0, "load_params");
    bytes.size = (size_t)n - 3;
    CHECK(call(gm, "load_params", 1, H(&bytes), kTVMBytes, I(0), 0) != 0, "truncated params");
  }
  free(params);
  call(gm, "run", 0, I(0), 0, I(0), 0);
  for (i = 0; i < 6; ++i) want[i] = (float)((1 + i + 10 + i) * 2 + 1 + i);
  CHECK(out_is(gm, want), "output with the loaded params");
  CHECK(TVMArrayAlloc((int64_t[]){2, 3}, 2, kDLFloat, 32, 1, kDLCPU, 0, &out) == 0 &&
            call(gm, "get_output", 2, I(0), kTVMArgInt, H(out), kTVMDLTensorHandle) == 0 &&
            TVMArrayCopyToBytes(out, vals, sizeof(vals)) == 0 && vals[5] == want[5],
        "get_output into a tensor");
  CHECK(call(gm, "get_output", 1, I(7), kTVMArgInt, I(0), 0) != 0, "get_output out of range");
  {
    /* set_output_zero_copy where the output shares its storage: copied after each run */
    DLTensor* z = tensor23(-1);
    CHECK(call(gm, "set_output_zero_copy", 2, I(0), kTVMArgInt, H(z), kTVMDLTensorHandle) == 0 &&
              call(gm, "run", 0, I(0), 0, I(0), 0) == 0 && ((float*)z->data)[5] == want[5] &&
              ((float*)z->data)[0] == want[0],
          "set_output_zero_copy of a shared entry: copied by run");
    CHECK(call(gm, "set_output_zero_copy", 2, I(3), kTVMArgInt, H(z), kTVMDLTensorHandle) != 0 &&
              strstr(TVMGetLastError(), "output index below 1"),
          "set_output_zero_copy index out of range");
    /* the factory's params (as load_params reads them) restore p0 = arange */
    CHECK(call(fac, "get_graph_params", 0, I(0), 0, I(0), 0) == 0 && code == kTVMBytes,
          "get_graph_params: the params blob");
    CHECK(call(gm, "load_params", 1, ret, kTVMBytes, I(0), 0) == 0 &&
              call(gm, "run", 0, I(0), 0, I(0), 0) == 0 &&
              ((float*)z->data)[5] == (float)((1 + 5 + 10 + 5) * 5 + 1 + 5),
          "load_params(get_graph_params()); the output stays bound");
    call(gm, "set_output_zero_copy", 1, I(0), kTVMArgInt, I(0), 0);
    TVMArrayFree(z);
  }
  CHECK(TVMFuncGetGlobal("kiln.test.none", &g) == 0 && g == NULL, "no such global");
  TVMArrayFree(x);
  TVMArrayFree(y);
  TVMArrayFree(bad);
  TVMArrayFree(out);
  TVMModFree(gm);
  TVMModFree(fac);
  return 0;
}

static int twice(TVMValue* args, int* codes, int n, TVMValue* r, int* rc, void* res) {
  r->v_int64 = 2 * args[0].v_int64 + *(int*)res;
  *rc = kTVMArgInt;
  return 0;
}

static int globals(void) {
  static int offset = 1;
  TVMFunctionHandle f, g;
  TVMValue a[1];
  int c[1] = {kTVMArgInt};
  a[0].v_int64 = 20;
  CHECK(TVMFuncCreateFromCFunc(twice, &offset, NULL, &f) == 0 &&
            TVMFuncRegisterGlobal("kiln.test.twice", f, 0) == 0, "TVMFuncRegisterGlobal");
  CHECK(TVMFuncRegisterGlobal("kiln.test.twice", f, 0) != 0, "duplicate global refused");
  TVMFuncFree(f);
  CHECK(TVMFuncGetGlobal("kiln.test.twice", &g) == 0 && g != NULL &&
            TVMFuncCall(g, a, c, 1, &ret, &code) == 0 && ret.v_int64 == 41,
        "TVMFuncGetGlobal + TVMFuncCall");
  TVMFuncFree(g);
  return 0;
}

static int consts(const char* so) {
  TVMModuleHandle fac, gm;
  DLTensor* x = tensor23(0);
  float want[6] = {0.5f, 2.5f, 4.5f, 6.5f, 8.5f, 10.5f}; /* x + w, w = 0.5 + i */
  CHECK(TVMModLoadFromFile(so, "so", &fac) == 0, "load const_loader library");
  CHECK(call(fac, "default", 0, I(0), 0, I(0), 0) == 0, "default() with a const_loader");
  gm = ret.v_handle;
  CHECK(call(gm, "set_input", 2, I(0), kTVMArgInt, H(x), kTVMDLTensorHandle) == 0 &&
            call(gm, "run", 0, I(0), 0, I(0), 0) == 0, "run: __init_ext_bias got the constant");
  CHECK(out_is(gm, want), "output x + w");
  {
    /* set_output_zero_copy: the kernel writes the bound tensor itself (its own storage) */
    DLTensor* y = tensor23(-1);
    const float* pool = (const float*)((DLTensor*)ret.v_handle)->data;
    float first = want[0];
    CHECK(call(gm, "set_output_zero_copy", 2, I(0), kTVMArgInt, H(y), kTVMDLTensorHandle) == 0 &&
              call(gm, "run", 0, I(0), 0, I(0), 0) == 0 && ((float*)y->data)[5] == want[5],
          "set_output_zero_copy: written by run");
    CHECK(call(gm, "get_output", 1, I(0), kTVMArgInt, I(0), 0) == 0 &&
              ((DLTensor*)ret.v_handle)->data == y->data,
          "set_output_zero_copy: in place (the entry is the bound memory)");
    CHECK(call(gm, "set_input_zero_copy", 2, I(0), kTVMArgInt, H(y), kTVMDLTensorHandle) != 0 &&
              strstr(TVMGetLastError(), "overlaps the zero-copy output 0"),
          "zero-copy input over a zero-copy output refused");
    CHECK(call(gm, "set_output_zero_copy", 2, I(0), kTVMArgInt, I(0), kTVMNullptr) == 0 &&
              call(gm, "get_output", 1, I(0), kTVMArgInt, I(0), 0) == 0 &&
              ((DLTensor*)ret.v_handle)->data == pool && pool[0] == first,
          "set_output_zero_copy(NULL) ends the binding");
    TVMArrayFree(y);
  }
  TVMArrayFree(x);
  TVMModFree(gm);
  TVMModFree(fac);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "graph") == 0) return graph(argv[2], argv[3]) || globals();
  if (argc == 3 && strcmp(argv[1], "const") == 0) return consts(argv[2]);
  fprintf(stderr, "usage: native_api_test graph model.so params.bin | const consts.so\n");
  return 2;
}

/*
 * kiln_run's VM path (included by kiln_run.c: one program, its helpers shared): load a VM
 * library's executable, vm_load_executable, vm_initialization(cpu), then main on inputs of the
 * shapes --input-shape (or --shape) gives, read from files or made up (--random); the result's
 * tensors written in order. An input no option sizes takes the values of its symbols from the
 * inputs that share them (the VM's get_function_param_shape names them). Timings as for graphs.
 */

/* The shape given for NAME ("1x7" or "1,7", split from its name at parse time): 0 when found,
   -1 when not given, 2 when malformed. */
static int vm_shape(char** names, char** shapes, int nshapes, const char* name, int64_t* dims,
                    int* ndim) {
  int k;
  for (k = 0; k < nshapes; ++k) {
    const char* p = shapes[k];
    if (strcmp(names[k], name) != 0) continue;
    *ndim = 0;
    while (*p) {
      char* end;
      long long d = strtoll(p, &end, 10);
      if (end == p || d < 0 || *ndim >= 32) return 2;
      dims[(*ndim)++] = d;
      if (*end == 'x' || *end == 'X' || *end == ',') end++;
      else if (*end) return 2;
      p = end;
    }
    return 0;
  }
  return -1;
}

/* Symbols a given shape fixed: the other inputs that have them take their values. */
#define VM_MAX_SYMBOLS 64
typedef struct {
  char name[128];
  char from[128]; /* the input whose shape set it */
  int64_t value;
} VMSymbol;

/* Dim d of a signature "1,seq,4" (get_function_param_shape) into tok; the rank when d < 0. */
static int vm_spec_dim(const char* spec, int d, char* tok, size_t n) {
  int k = 0;
  const char* p = spec;
  if (*spec == '\0') return d < 0 ? 0 : -1; /* a scalar */
  for (;;) {
    const char* end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (k == d) {
      snprintf(tok, n, "%.*s", (int)len, p);
      return 0;
    }
    ++k;
    if (end == NULL) return d < 0 ? k : -1;
    p = end + 1;
  }
}

static VMSymbol* vm_symbol(VMSymbol* syms, int nsyms, const char* name) {
  int k;
  for (k = 0; k < nsyms; ++k)
    if (strcmp(syms[k].name, name) == 0) return &syms[k];
  return NULL;
}

/* A given shape of input `name`: checked against its rank, its symbols recorded (0, or 2 for
   a usage error, said on stderr). */
static int vm_bind(const char* name, const char* spec, const int64_t* dims, int ndim,
                   VMSymbol* syms, int* nsyms) {
  char tok[128];
  int d, rank = vm_spec_dim(spec, -1, tok, sizeof(tok));
  if (rank != ndim) {
    fprintf(stderr, "kiln_run: --input-shape %s: %d dims, but input %s has %d (%s)\n", name,
            ndim, name, rank, spec);
    return 2;
  }
  for (d = 0; d < ndim; ++d) {
    VMSymbol* s;
    vm_spec_dim(spec, d, tok, sizeof(tok));
    if (tok[0] >= '0' && tok[0] <= '9') continue; /* a size: the VM checks it */
    if ((s = vm_symbol(syms, *nsyms, tok)) != NULL) {
      if (s->value != dims[d]) {
        fprintf(stderr, "kiln_run: symbol %s is %lld (--input-shape %s) but %lld in "
                        "--input-shape %s\n", tok, (long long)s->value, s->from,
                (long long)dims[d], name);
        return 2;
      }
      continue;
    }
    if (*nsyms >= VM_MAX_SYMBOLS) continue;
    s = &syms[(*nsyms)++];
    snprintf(s->name, sizeof(s->name), "%s", tok);
    snprintf(s->from, sizeof(s->from), "%s", name);
    s->value = dims[d];
  }
  return 0;
}

/* The shape of an input no option gave, from the symbols the given ones fixed (0, or 2 with
   the symbol no shape sets named on stderr). */
static int vm_derive(const char* name, const char* spec, int64_t* dims, int* ndim,
                     const VMSymbol* syms, int nsyms) {
  char tok[128];
  int d;
  *ndim = vm_spec_dim(spec, -1, tok, sizeof(tok));
  for (d = 0; d < *ndim && d < 32; ++d) {
    const VMSymbol* s;
    vm_spec_dim(spec, d, tok, sizeof(tok));
    if (tok[0] >= '0' && tok[0] <= '9') {
      dims[d] = strtoll(tok, NULL, 10);
      continue;
    }
    if ((s = vm_symbol((VMSymbol*)syms, nsyms, tok)) == NULL) {
      fprintf(stderr, "kiln_run: give --input-shape %s:DIMxDIM... (input %s is [%s]: no "
                      "other input's shape sets %s)\n", name, name, spec, tok);
      return 2;
    }
    dims[d] = s->value;
  }
  return 0;
}

static void vm_random_fill(DLTensor* t, uint64_t seed) {
  size_t n = KilnArrayNumBytes(t) / ((t->dtype.bits + 7) / 8), i;
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (i = 0; i < n; ++i) {
    uint32_t r;
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    r = (uint32_t)(x >> 33);
    if (t->dtype.code == kDLFloat && t->dtype.bits == 32) ((float*)t->data)[i] = (float)(r % 2000001) / 1e6f - 1.0f;
    else if (t->dtype.code == kDLFloat && t->dtype.bits == 64) ((double*)t->data)[i] = (double)(r % 2000001) / 1e6 - 1.0;
    else if (t->dtype.bits == 64) ((int64_t*)t->data)[i] = r % 100;
    else if (t->dtype.bits == 32) ((int32_t*)t->data)[i] = (int32_t)(r % 100);
    else if (t->dtype.bits == 16) ((uint16_t*)t->data)[i] = (uint16_t)(r % 100);
    else ((uint8_t*)t->data)[i] = (uint8_t)(t->dtype.code == 6 ? r % 2 : r % 100);
  }
}

/* The result's tensors in order (a tuple flattened); at most cap. */
static int vm_flatten(TVMValue v, int code, const DLTensor** out, int n, int cap) {
  int k, size;
  if (code == kTVMDLTensorHandle) {
    if (n < cap) out[n] = (const DLTensor*)v.v_handle;
    return n + 1;
  }
  if (code != kTVMObjectHandle) return n;
  size = KilnTupleSize(v.v_handle);
  for (k = 0; k < size; ++k) {
    TVMValue item;
    int item_code;
    if (KilnTupleGetItem(v.v_handle, k, &item, &item_code) != 0) return n;
    n = vm_flatten(item, item_code, out, n, cap);
  }
  return n;
}

static int run_vm(TVMModuleHandle exe, double t0, int repeat, char** shape_names, char** shapes,
                  int nshapes, int random_inputs, char** files, int nfiles) {
  TVMModuleHandle vm;
  TVMFunctionHandle f_load, f_init, f_main, f_arity, f_name, f_dtype, f_shape;
  VMSymbol syms[VM_MAX_SYMBOLS];
  int nsyms = 0, pass;
  char (*names)[256], (*specs)[512];
  TVMValue args[3], ret, *in_args;
  int codes[3], code, *in_codes, nin, nout, k, i, rc = 1;
  DLTensor** inputs;
  const DLTensor* outs[256];
  double t_load, t_first, t_total, *times, *cpu;
  if ((f_load = get(exe, "vm_load_executable")) == NULL) return 1;
  if (call(f_load, 0, args, codes, &ret, &code) != 0) return die("vm_load_executable");
  vm = ret.v_handle;
  TVMFuncFree(f_load);
  if ((f_init = get(vm, "vm_initialization")) == NULL || (f_main = get(vm, "main")) == NULL ||
      (f_arity = get(vm, "get_function_arity")) == NULL ||
      (f_name = get(vm, "get_function_param_name")) == NULL ||
      (f_dtype = get(vm, "get_function_param_dtype")) == NULL ||
      (f_shape = get(vm, "get_function_param_shape")) == NULL)
    return 1;
  for (k = 0; k < 3; ++k) codes[k] = kTVMArgInt;
  args[0].v_int64 = kDLCPU, args[1].v_int64 = 0, args[2].v_int64 = 2; /* pooled allocator */
  if (call(f_init, 3, args, codes, &ret, &code) != 0) return die("vm_initialization");
  t_load = now_ms() - t0;
  args[0].v_str = "main";
  codes[0] = kTVMStr;
  if (call(f_arity, 1, args, codes, &ret, &code) != 0) return die("get_function_arity");
  nin = (int)ret.v_int64;
  inputs = (DLTensor**)calloc((size_t)nin + 1, sizeof(DLTensor*));
  in_args = (TVMValue*)calloc((size_t)nin + 1, sizeof(TVMValue));
  in_codes = (int*)calloc((size_t)nin + 1, sizeof(int));
  if (!random_inputs && nfiles < nin) {
    fprintf(stderr, "kiln_run: main has %d inputs: give their files, or --random\n", nin);
    return 2;
  }
  names = calloc((size_t)nin + 1, sizeof(*names));
  specs = calloc((size_t)nin + 1, sizeof(*specs));
  for (k = 0; k < nin; ++k) { /* each input's name and signature ("1,seq,4") */
    args[0].v_str = "main";
    codes[0] = kTVMStr;
    args[1].v_int64 = k;
    codes[1] = kTVMArgInt;
    if (call(f_name, 2, args, codes, &ret, &code) != 0) return die("get_function_param_name");
    snprintf(names[k], sizeof(names[k]), "%s", ret.v_str);
    if (call(f_shape, 2, args, codes, &ret, &code) != 0) return die("get_function_param_shape");
    snprintf(specs[k], sizeof(specs[k]), "%s", ret.v_str);
  }
  for (pass = 0; pass < 2; ++pass) /* the given shapes fix their symbols, then the others */
    for (k = 0; k < nin; ++k) {
      int64_t dims[32];
      int ndim = 0, found = vm_shape(shape_names, shapes, nshapes, names[k], dims, &ndim);
      DLDataType dt;
      if (found == 2) {
        fprintf(stderr, "kiln_run: malformed --input-shape %s:DIMxDIM...\n", names[k]);
        return 2;
      }
      if (pass == 0) {
        if (found == 0 && vm_bind(names[k], specs[k], dims, ndim, syms, &nsyms) != 0) return 2;
        continue;
      }
      if (found < 0 && vm_derive(names[k], specs[k], dims, &ndim, syms, nsyms) != 0) return 2;
      args[0].v_str = "main";
      codes[0] = kTVMStr;
      args[1].v_int64 = k;
      codes[1] = kTVMArgInt;
      if (call(f_dtype, 2, args, codes, &ret, &code) != 0) return die("get_function_param_dtype");
      dt = ret.v_type;
      if (TVMArrayAlloc(dims, ndim, dt.code, dt.bits, dt.lanes, kDLCPU, 0, &inputs[k]) != 0)
        return die("input");
      if (random_inputs) vm_random_fill(inputs[k], (uint64_t)k + 1);
      else if (read_file(files[k], inputs[k]) != 0) return 1;
      in_args[k].v_handle = inputs[k];
      in_codes[k] = kTVMDLTensorHandle;
    }
  free(names);
  free(specs);
  t0 = now_ms();
  if (call(f_main, nin, in_args, in_codes, &ret, &code) != 0) return die("main");
  t_first = now_ms() - t0;
  times = (double*)calloc(2 * (size_t)repeat + 1, sizeof(double));
  cpu = times + repeat;
  t_total = 0;
  for (i = 0; i < repeat; ++i) {
    double c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
    t0 = now_ms();
    if (call(f_main, nin, in_args, in_codes, &ret, &code) != 0) return die("main");
    times[i] = now_ms() - t0;
    cpu[i] = clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    t_total += times[i];
  }
  qsort(times, (size_t)repeat, sizeof(double), cmp_double);
  qsort(cpu, (size_t)repeat, sizeof(double), cmp_double);
  nout = vm_flatten(ret, code, outs, 0, 256);
  k = random_inputs ? 0 : nin; /* the first output file */
  if (nfiles - k != 0 && nfiles - k != nout) {
    fprintf(stderr, "kiln_run: main returns %d tensors: give %d output files, not %d\n", nout,
            nout, nfiles - k);
    rc = 2;
    goto done;
  }
  for (i = 0; k < nfiles && i < nout && i < 256; ++i, ++k) {
    FILE* f = fopen(files[k], "wb");
    if (f == NULL || fwrite(outs[i]->data, 1, KilnArrayNumBytes(outs[i]), f) !=
                         KilnArrayNumBytes(outs[i])) {
      fprintf(stderr, "kiln_run: cannot write %s\n", files[k]);
      if (f) fclose(f);
      goto done;
    }
    fclose(f);
  }
  print_times(t_load, t_first, t_total, times, cpu, repeat);
  rc = 0;
done:
  free(times);
  for (k = 0; k < nin; ++k) TVMArrayFree(inputs[k]);
  free(inputs);
  free(in_args);
  free(in_codes);
  TVMFuncFree(f_init);
  TVMFuncFree(f_main);
  TVMFuncFree(f_arity);
  TVMFuncFree(f_name);
  TVMFuncFree(f_dtype);
  TVMFuncFree(f_shape);
  TVMModFree(vm);
  return rc;
}

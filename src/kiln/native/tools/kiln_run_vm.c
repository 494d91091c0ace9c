/*
 * kiln_run's VM path (included by kiln_run.c: one program, its helpers shared): load a VM
 * library's executable, vm_load_executable, vm_initialization(cpu), then main on inputs of the
 * shapes --shape gives, read from files or made up (--random); the result's tensors written in
 * order. Timings as for graphs.
 */

/* "NAME=1x7" -> dims of NAME; 0 when found, -1 when not given, 2 on a malformed shape */
static int vm_shape(char** shapes, int nshapes, const char* name, int64_t* dims, int* ndim) {
  int k;
  size_t len = strlen(name);
  for (k = 0; k < nshapes; ++k) {
    const char* p = shapes[k];
    if (strncmp(p, name, len) != 0 || p[len] != '=') continue;
    p += len + 1;
    *ndim = 0;
    while (*p) {
      char* end;
      long long d = strtoll(p, &end, 10);
      if (end == p || d < 0 || *ndim >= 32) return 2;
      dims[(*ndim)++] = d;
      if (*end == 'x') end++;
      else if (*end) return 2;
      p = end;
    }
    return 0;
  }
  return -1;
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

static int run_vm(TVMModuleHandle exe, double t0, int repeat, char** shapes, int nshapes,
                  int random_inputs, char** files, int nfiles) {
  TVMModuleHandle vm;
  TVMFunctionHandle f_load, f_init, f_main, f_arity, f_name, f_dtype;
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
      (f_dtype = get(vm, "get_function_param_dtype")) == NULL)
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
  for (k = 0; k < nin; ++k) {
    char name[256];
    int64_t dims[32];
    int ndim = 0, found;
    DLDataType dt;
    args[0].v_str = "main";
    codes[0] = kTVMStr;
    args[1].v_int64 = k;
    codes[1] = kTVMArgInt;
    if (call(f_name, 2, args, codes, &ret, &code) != 0) return die("get_function_param_name");
    snprintf(name, sizeof(name), "%s", ret.v_str);
    if (call(f_dtype, 2, args, codes, &ret, &code) != 0) return die("get_function_param_dtype");
    dt = ret.v_type;
    if ((found = vm_shape(shapes, nshapes, name, dims, &ndim)) != 0) {
      fprintf(stderr, "kiln_run: %s --shape %s=DIMxDIM... (a VM model's dims are symbolic)\n",
              found < 0 ? "give" : "malformed", name);
      return 2;
    }
    if (TVMArrayAlloc(dims, ndim, dt.code, dt.bits, dt.lanes, kDLCPU, 0, &inputs[k]) != 0)
      return die("input");
    if (random_inputs) vm_random_fill(inputs[k], (uint64_t)k + 1);
    else if (read_file(files[k], inputs[k]) != 0) return 1;
    in_args[k].v_handle = inputs[k];
    in_codes[k] = kTVMDLTensorHandle;
  }
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
  TVMModFree(vm);
  return rc;
}

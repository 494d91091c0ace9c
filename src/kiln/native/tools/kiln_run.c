/*
 * kiln_run: run a model library exported by Kiln with the native runtime, no Python (the native
 * twin of `kiln run`).
 *
 *     kiln_run model.so [--repeat N] IN.bin... OUT.bin...   (KILN_NUM_THREADS: kernel threads)
 *     kiln_run vm_model.so [--repeat N] --input-shape NAME:1x7... [--random] [IN.bin...]
 *              [OUT.bin...]
 *
 * Inputs and outputs are raw tensors (C order, the graph's dtype) in the graph's input order
 * (get_input_name) and output order; each input file must hold exactly the input's bytes.
 * A VM library (symbolic dims, decision 014) runs its function main: --input-shape NAME:1x7
 * (as `kiln run`; --shape NAME=1x7 is the same) gives an input's shape, and an input sharing
 * a symbol with a given one needs none (the symbol's value carries over); the inputs are read
 * from the first files, or with --random made up (integers in
 * [0, 100), floats in [-1, 1)); the result's tensors (a tuple flattened in order) are written
 * to the remaining files, when given (kiln_run_vm.c).
 * Prints the load time, the first inference (start-up to first result) and the mean, min and
 * median latency of N further runs, and the min and median of their CPU time (this thread's:
 * with one kernel thread, what the run costs whatever else the machine does). Exit status 0, or
 * 1 with the runtime's message on stderr (2: usage). -h/--help: the usage on stdout, exit 0.
 */
#include <kiln/runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_ms(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int die(const char* what) {
  fprintf(stderr, "kiln_run: %s: %s\n", what, TVMGetLastError());
  return 1;
}

/* Call f with up to two arguments; ret/code receive the result. */
static int call(TVMFunctionHandle f, int n, TVMValue* args, int* codes, TVMValue* ret, int* code) {
  return TVMFuncCall(f, args, codes, n, ret, code);
}

static TVMFunctionHandle get(TVMModuleHandle m, const char* name) {
  TVMFunctionHandle f = NULL;
  if (TVMModGetFunction(m, name, 0, &f) == 0 && f == NULL)
    fprintf(stderr, "kiln_run: the module has no function %s\n", name);
  return f;
}

static int read_file(const char* path, DLTensor* t) {
  size_t want = KilnArrayNumBytes(t), got;
  FILE* f = fopen(path, "rb");
  long size;
  if (f == NULL) {
    fprintf(stderr, "kiln_run: cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (size < 0 || (size_t)size != want) {
    fprintf(stderr, "kiln_run: %s holds %ld bytes, the input needs %zu\n", path, size, want);
    fclose(f);
    return 1;
  }
  got = fread(t->data, 1, want, f);
  fclose(f);
  if (got != want) {
    fprintf(stderr, "kiln_run: cannot read %s\n", path);
    return 1;
  }
  return 0;
}

/* The latency report: load, first run, and over `repeat` sorted runs (wall and CPU ms). */
static void print_times(double t_load, double t_first, double t_total, const double* times,
                        const double* cpu, int repeat) {
  printf("load: %.3f ms\nfirst run: %.3f ms\nstart-up to first result: %.3f ms\n", t_load,
         t_first, t_load + t_first);
  if (repeat > 0)
    printf("mean: %.3f ms over %d runs\nmin: %.3f ms\nmedian: %.3f ms\n"
           "cpu min: %.3f ms\ncpu median: %.3f ms\n", t_total / repeat, repeat, times[0],
           times[repeat / 2], cpu[0], cpu[repeat / 2]);
}

static void print_usage(FILE* out) {
  fprintf(out, "usage: kiln_run model.so [--repeat N] IN.bin... OUT.bin...\n"
               "       kiln_run vm_model.so [--repeat N] --input-shape NAME:1x7... [--random] "
               "[IN.bin...] [OUT.bin...]\n");
}

static int usage(void) {
  print_usage(stderr);
  return 2;
}

static int help(void) {
  print_usage(stdout);
  printf("\nRun a model library exported by Kiln with the native runtime (no Python).\n"
         "IN.bin, OUT.bin: raw tensors (C order, the graph's dtype), in the graph's input and\n"
         "output order; each input file holds exactly the input's bytes.\n\n"
         "  --repeat N          timed runs after the first one (default: 10)\n"
         "  --input-shape NAME:1x7\n"
         "                      a VM library's input shape (symbolic dims); inputs sharing\n"
         "                      a symbol with it need none (--shape NAME=1x7: the same)\n"
         "  --random            a VM library: made-up inputs instead of IN.bin files\n"
         "  -h, --help          this help\n\n"
         "KILN_NUM_THREADS: kernel threads. Exit status: 0, 1 (the runtime's error), 2 (usage).\n");
  return 0;
}

#include "kiln_run_vm.c"


int main(int argc, char** argv) {
  TVMModuleHandle factory, gm;
  TVMFunctionHandle f_default, f_set, f_run, f_out, f_nin, f_nout, f_name, f_in;
  TVMValue args[2], ret;
  int codes[2], code, i, k, repeat = 10, nin, nout, nfiles;
  char **files, **shapes, **shape_names;
  int nshapes = 0, random_inputs = 0;
  double t0, t_load, t_first, t_total, *times, *cpu;
  for (i = 1; i < argc; ++i)
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return help();
  if (argc < 2 || argv[1][0] == '-') return usage(); /* an option, not the library */
  files = (char**)calloc((size_t)argc, sizeof(char*));
  shapes = (char**)calloc((size_t)argc, sizeof(char*));
  shape_names = (char**)calloc((size_t)argc, sizeof(char*));
  for (i = 2, nfiles = 0; i < argc; ++i) {
    int colon = strcmp(argv[i], "--input-shape") == 0;
    if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = atoi(argv[++i]);
    else if ((colon || strcmp(argv[i], "--shape") == 0) && i + 1 < argc) {
      /* NAME:1x7 (NAME=1x7 for --shape), split at the last separator: a name may hold one */
      char* sep = strrchr(argv[++i], colon ? ':' : '=');
      if (sep == NULL || sep == argv[i]) {
        fprintf(stderr, "kiln_run: %s %s: expected NAME%s1x7\n", colon ? "--input-shape" :
                "--shape", argv[i], colon ? ":" : "=");
        return 2;
      }
      *sep = '\0';
      shape_names[nshapes] = argv[i];
      shapes[nshapes++] = sep + 1;
    } else if (strcmp(argv[i], "--random") == 0) random_inputs = 1;
    else if (strncmp(argv[i], "--", 2) == 0) return usage();
    else files[nfiles++] = argv[i];
  }
  if (repeat < 0) return usage();
  t0 = now_ms();
  if (TVMModLoadFromFile(argv[1], "so", &factory) != 0) return die("load");
  if (strcmp(KilnModTypeKey(factory), "relax.VMExecutable") == 0) {
    int rc = run_vm(factory, t0, repeat, shape_names, shapes, nshapes, random_inputs, files,
                    nfiles);
    TVMModFree(factory);
    free(files);
    free(shapes);
    free(shape_names);
    return rc;
  }
  if (nshapes || random_inputs) return usage();
  if ((f_default = get(factory, "default")) == NULL) return 1;
  args[0].v_device.device_type = kDLCPU;
  args[0].v_device.device_id = 0;
  codes[0] = kDLDeviceArg;
  if (call(f_default, 1, args, codes, &ret, &code) != 0) return die("default(cpu)");
  gm = ret.v_handle;
  t_load = now_ms() - t0;
  if ((f_set = get(gm, "set_input")) == NULL || (f_run = get(gm, "run")) == NULL ||
      (f_out = get(gm, "get_output")) == NULL || (f_nin = get(gm, "get_num_inputs")) == NULL ||
      (f_nout = get(gm, "get_num_outputs")) == NULL || (f_name = get(gm, "get_input_name")) == NULL ||
      (f_in = get(gm, "get_input")) == NULL)
    return 1;
  if (call(f_nin, 0, args, codes, &ret, &code) != 0) return die("get_num_inputs");
  nin = (int)ret.v_int64;
  if (call(f_nout, 0, args, codes, &ret, &code) != 0) return die("get_num_outputs");
  nout = (int)ret.v_int64;
  if (nfiles != nin + nout) {
    fprintf(stderr, "kiln_run: the model has %d inputs and %d outputs: give %d files, not %d\n",
            nin, nout, nin + nout, nfiles);
    return 2;
  }
  for (k = 0; k < nin; ++k) { /* read straight into the executor's input storage */
    args[0].v_int64 = k;
    codes[0] = kTVMArgInt;
    if (call(f_in, 1, args, codes, &ret, &code) != 0) return die("get_input");
    if (read_file(files[k], (DLTensor*)ret.v_handle) != 0) return 1;
  }
  t0 = now_ms();
  if (call(f_run, 0, args, codes, &ret, &code) != 0) return die("run");
  t_first = now_ms() - t0;
  times = (double*)calloc(2 * (size_t)repeat + 1, sizeof(double));
  cpu = times + repeat; /* this thread's CPU time: what the kernels cost on a busy machine */
  t_total = 0;
  for (i = 0; i < repeat; ++i) {
    double c0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
    t0 = now_ms();
    if (call(f_run, 0, args, codes, &ret, &code) != 0) return die("run");
    times[i] = now_ms() - t0;
    cpu[i] = clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    t_total += times[i];
  }
  qsort(times, (size_t)repeat, sizeof(double), cmp_double);
  qsort(cpu, (size_t)repeat, sizeof(double), cmp_double);
  for (k = 0; k < nout; ++k) {
    const DLTensor* y;
    FILE* f;
    args[0].v_int64 = k;
    codes[0] = kTVMArgInt;
    if (call(f_out, 1, args, codes, &ret, &code) != 0) return die("get_output");
    y = (const DLTensor*)ret.v_handle;
    if ((f = fopen(files[nin + k], "wb")) == NULL ||
        fwrite(y->data, 1, KilnArrayNumBytes(y), f) != KilnArrayNumBytes(y)) {
      fprintf(stderr, "kiln_run: cannot write %s\n", files[nin + k]);
      return 1;
    }
    fclose(f);
  }
  print_times(t_load, t_first, t_total, times, cpu, repeat);
  free(times);
  TVMFuncFree(f_default);
  TVMFuncFree(f_set);
  TVMFuncFree(f_run);
  TVMFuncFree(f_out);
  TVMFuncFree(f_nin);
  TVMFuncFree(f_nout);
  TVMFuncFree(f_name);
  TVMFuncFree(f_in);
  TVMModFree(gm);
  TVMModFree(factory);
  free(files);
  free(shapes);
  free(shape_names);
  return 0;
}

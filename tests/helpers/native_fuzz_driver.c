/*
 * Fuzz driver of libkiln_runtime's loader (tests/backend/native/test_native_fuzz.py builds it with the
 * runtime's sources under -fsanitize=address,undefined). Reads cases from a corpus file of
 * records (u64 little-endian length + bytes) and loads each:
 *
 *   native_fuzz_driver blob GOOD.so CORPUS   each record is a __tvm_dev_mblob payload, unpacked
 *                                            in this process over GOOD.so's library module
 *                                            (KilnModLoadFromBlob), then the executor created
 *                                            (graphs) or the VM initialized (VM executables)
 *   native_fuzz_driver file GOOD.so CORPUS   each record is a whole .so file, written to a file
 *                                            and loaded (TVMModLoadFromFile) in a child process
 *   native_fuzz_driver run GOOD.so CORPUS    as blob, then the executor's "run" called (for
 *                                            payloads whose graph calls only functions that
 *                                            check their arguments: kiln_json interpreters)
 *
 * A case passes when loading returns (an error is fine: a damaged file must be an error). Each
 * record is copied into a heap block of exactly its size, so ASan reports any read past it. A
 * crash, a sanitizer report or a hang (alarm, 10 s) ends the run with the case index on stderr.
 * Prints "cases N errors E" on success.
 */
#include <kiln/runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile long current_case = -1;
static int run_graphs; /* "run" mode */

static void on_signal(int sig) {
  char msg[96];
  int n = snprintf(msg, sizeof(msg), "native_fuzz_driver: case %ld: signal %d\n", current_case,
                   sig);
  if (n > 0) (void)!write(2, msg, (size_t)n);
  _exit(3);
}

void __sanitizer_set_death_callback(void (*callback)(void));
static void on_death(void) {
  fprintf(stderr, "native_fuzz_driver: case %ld: sanitizer report above\n", current_case);
}

/* Create an executor with the factory's "default" (when it has one), or a VM with the VM
   executable's vm_load_executable and vm_initialization(cpu) (the bytecode is decoded at load
   and every call site prepared at initialization; nothing runs: kernels trust the shapes the
   bytecode gives them, as TVM's do), and free all. */
static int try_vm(TVMModuleHandle root, TVMFunctionHandle load) {
  TVMFunctionHandle init = NULL;
  TVMValue args[3], ret, out;
  int codes[3] = {kTVMArgInt, kTVMArgInt, kTVMArgInt}, code, rc;
  if (TVMFuncCall(load, NULL, NULL, 0, &ret, &code) != 0) return -1;
  (void)root;
  rc = TVMModGetFunction(ret.v_handle, "vm_initialization", 0, &init);
  if (rc == 0 && init != NULL) {
    args[0].v_int64 = kDLCPU, args[1].v_int64 = 0, args[2].v_int64 = 2;
    rc = TVMFuncCall(init, args, codes, 3, &out, &code);
    TVMFuncFree(init);
  }
  TVMModFree(ret.v_handle);
  return rc;
}

static int try_root(TVMModuleHandle root) {
  TVMFunctionHandle f = NULL;
  TVMValue args[1], ret;
  int codes[1], code, rc = 0;
  if (TVMModGetFunction(root, "vm_load_executable", 0, &f) != 0) return -1;
  if (f != NULL) {
    rc = try_vm(root, f);
    TVMFuncFree(f);
    return rc;
  }
  if (TVMModGetFunction(root, "default", 0, &f) != 0) return -1;
  if (f != NULL) {
    args[0].v_device.device_type = kDLCPU;
    args[0].v_device.device_id = 0;
    codes[0] = kDLDeviceArg;
    rc = TVMFuncCall(f, args, codes, 1, &ret, &code);
    if (rc == 0 && code == kTVMModuleHandle) {
      TVMFunctionHandle run = NULL;
      if (run_graphs && TVMModGetFunction(ret.v_handle, "run", 0, &run) == 0 && run != NULL) {
        TVMValue out;
        rc = TVMFuncCall(run, NULL, NULL, 0, &out, &code);
        TVMFuncFree(run);
      }
      TVMModFree(ret.v_handle);
    }
    TVMFuncFree(f);
  }
  return rc;
}

static int load_file(const char* path) {
  TVMModuleHandle root;
  int rc;
  if (TVMModLoadFromFile(path, "so", &root) != 0) return -1;
  rc = try_root(root);
  TVMModFree(root);
  return rc;
}

int main(int argc, char** argv) {
  FILE* f;
  long cases = 0, errors = 0;
  int file_mode;
  TVMModuleHandle good, lib = NULL;
  char tmp[4096];
  unsigned char* corpus = NULL;
  long size = 0;
  size_t pos = 0;
  if (argc != 4 || (strcmp(argv[1], "blob") != 0 && strcmp(argv[1], "file") != 0 &&
                    strcmp(argv[1], "run") != 0)) {
    fprintf(stderr, "usage: native_fuzz_driver blob|file|run GOOD.so CORPUS\n");
    return 2;
  }
  file_mode = strcmp(argv[1], "file") == 0;
  run_graphs = strcmp(argv[1], "run") == 0;
  signal(SIGALRM, on_signal);
  __sanitizer_set_death_callback(on_death);
  if (!file_mode) { /* the good library's module stands for _lib in every case (none when
                       its root has no library: a VM executable without kernels) */
    TVMFunctionHandle get_lib = NULL;
    TVMValue ret;
    int code;
    if (TVMModLoadFromFile(argv[2], "so", &good) != 0 ||
        TVMModGetFunction(good, "get_lib", 0, &get_lib) != 0 || get_lib == NULL) {
      fprintf(stderr, "cannot load the good library: %s\n", TVMGetLastError());
      return 2;
    }
    lib = TVMFuncCall(get_lib, NULL, NULL, 0, &ret, &code) == 0 ? ret.v_handle : NULL;
    TVMFuncFree(get_lib);
    TVMModFree(good);
  }
  snprintf(tmp, sizeof(tmp), "%s.case.so", argv[3]);
  /* the whole corpus first: a forked child's exit must not move a shared stream's offset */
  if ((f = fopen(argv[3], "rb")) == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0 || (corpus = (unsigned char*)malloc((size_t)size + 1)) == NULL ||
      fread(corpus, 1, (size_t)size, f) != (size_t)size) {
    fprintf(stderr, "cannot read %s\n", argv[3]);
    return 2;
  }
  fclose(f);
  while (pos + 8 <= (size_t)size) {
    unsigned long long len = 0;
    unsigned char* data;
    int i, rc;
    for (i = 0; i < 8; ++i) len |= (unsigned long long)corpus[pos + i] << (8 * i);
    pos += 8;
    if (len > (size_t)size - pos || (data = (unsigned char*)malloc(len ? len : 1)) == NULL) {
      fprintf(stderr, "corrupt corpus file at case %ld\n", cases);
      return 2;
    }
    memcpy(data, corpus + pos, len);
    pos += len;
    current_case = cases;
    if (file_mode) {
      FILE* out = fopen(tmp, "wb");
      pid_t pid;
      int status;
      if (out == NULL || fwrite(data, 1, len, out) != len || fclose(out) != 0) return 2;
      if ((pid = fork()) == 0) {
        free(corpus);
        free(data);
        alarm(10);
        exit(load_file(tmp) == 0 ? 0 : 1);
      }
      if (pid < 0 || waitpid(pid, &status, 0) != pid) return 2;
      if (!WIFEXITED(status) || WEXITSTATUS(status) > 1) {
        fprintf(stderr, "native_fuzz_driver: case %ld: child %s %d\n", cases,
                WIFEXITED(status) ? "exited with" : "killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        _exit(1); /* not a leak report of this process on top of the child's */
      }
      rc = WEXITSTATUS(status) ? -1 : 0;
    } else {
      TVMModuleHandle root;
      alarm(10);
      rc = KilnModLoadFromBlob(data, (size_t)len, lib, &root);
      if (rc == 0) {
        rc = try_root(root);
        TVMModFree(root);
      }
      alarm(0);
    }
    errors += rc != 0;
    free(data);
    ++cases;
  }
  free(corpus);
  remove(tmp);
  if (lib) TVMModFree(lib);
  printf("cases %ld errors %ld\n", cases, errors);
  return 0;
}

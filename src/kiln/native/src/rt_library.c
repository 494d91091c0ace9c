/*
 * The library module: a dlopen'ed shared library exported by Kiln, its kernels found by dlsym
 * (TVM's src/runtime/dso_library.cc and library_module.cc; Kiln's kiln/runtime/load.py and
 * library_module.py, whose checks this file repeats). TVMModLoadFromFile:
 *
 *   1. the file is an ELF shared library for this machine whose PT_LOAD segments lie inside the
 *      file (a truncated file fails here, before dlopen: kiln/runtime/elf.py);
 *   2. this CPU has the features the library's __kiln_target_info lists (read from the file,
 *      before dlopen runs any of its code: kiln_check_target_info, rt_blob.c);
 *   3. dlopen (RTLD_LOCAL: two models' symbols never mix);
 *   4. __tvm_dev_mblob exists and its u64 length fits inside the file-backed part of the
 *      segment holding it (dl_iterate_phdr), so a corrupt length never reads unmapped memory;
 *   5. the blob unpacks (rt_blob.c) with this library as _lib.
 *
 * Only the names listed in __kiln_func_names (NUL-separated, ended by an extra NUL; written by
 * export_library) are served, so a lookup never returns an unrelated symbol such as malloc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_internal.h"

#if defined(__x86_64__)
#define KILN_EM EM_X86_64
#elif defined(__aarch64__)
#define KILN_EM EM_AARCH64
#elif defined(__riscv)
#define KILN_EM EM_RISCV
#elif defined(__i386__)
#define KILN_EM EM_386
#elif defined(__arm__)
#define KILN_EM EM_ARM
#endif

#if UINTPTR_MAX == 0xffffffffffffffffULL
typedef Elf64_Ehdr KilnEhdr;
typedef Elf64_Phdr KilnPhdr;
#define KILN_ELFCLASS ELFCLASS64
#else
typedef Elf32_Ehdr KilnEhdr;
typedef Elf32_Phdr KilnPhdr;
#define KILN_ELFCLASS ELFCLASS32
#endif

typedef struct {
  KilnModule base;
  void* handle;
  char* path;
  const char* names; /* __kiln_func_names, or NULL: serve any symbol */
  size_t names_len;
  const char* (*lib_error)(void);
} KilnLibrary;

/* 1: the ELF checks of kiln/runtime/elf.py, before dlopen. */
static int kiln_check_elf(const char* path) {
  FILE* f = fopen(path, "rb");
  KilnEhdr eh;
  struct stat st;
  int i, rc = 0;
  if (f == NULL) return kiln_fail("cannot load module: %s cannot be opened", path);
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return kiln_fail("cannot load module: %s is not a file", path);
  }
  if (fread(&eh, 1, sizeof(eh), f) != sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    fclose(f);
    return kiln_fail("%s: not an ELF shared library (a .tar or .o export needs relinking: load "
                     "it with the Python runtime, or export a .so)", path);
  }
  if (eh.e_ident[EI_CLASS] != KILN_ELFCLASS || eh.e_ident[EI_DATA] != ELFDATA2LSB)
    rc = kiln_fail("%s: ELF class or byte order of another machine", path);
#ifdef KILN_EM
  else if (eh.e_machine != KILN_EM)
    rc = kiln_fail("%s: built for ELF machine %d, this runtime runs on machine %d", path,
                   eh.e_machine, KILN_EM);
#endif
  else if (eh.e_type != ET_DYN)
    rc = kiln_fail("%s: not a shared library (ELF type %d); a relocatable .o export needs "
                   "relinking", path, eh.e_type);
  else if (eh.e_phentsize != sizeof(KilnPhdr) || eh.e_phnum == 0 ||
           (uint64_t)eh.e_phoff + (uint64_t)eh.e_phnum * sizeof(KilnPhdr) > (uint64_t)st.st_size)
    rc = kiln_fail("%s: truncated or corrupt ELF program headers", path);
  for (i = 0; rc == 0 && i < eh.e_phnum; ++i) {
    KilnPhdr ph;
    if (fseek(f, (long)(eh.e_phoff + (uint64_t)i * sizeof(ph)), SEEK_SET) != 0 ||
        fread(&ph, 1, sizeof(ph), f) != sizeof(ph)) {
      rc = kiln_fail("%s: cannot read ELF program header %d", path, i);
    } else if (ph.p_type == PT_LOAD && ((uint64_t)ph.p_offset + ph.p_filesz > (uint64_t)st.st_size ||
                                        ph.p_filesz > ph.p_memsz)) {
      rc = kiln_fail("%s: truncated: segment %d ends at byte %llu, the file has %lld", path, i,
                     (unsigned long long)(ph.p_offset + ph.p_filesz), (long long)st.st_size);
    }
  }
  fclose(f);
  return rc;
}

/* 4: bytes readable from addr to the end of the file-backed part of its loaded segment. */
typedef struct {
  uintptr_t addr;
  size_t readable;
  int found;
} KilnSegQuery;

static int kiln_segment_cb(struct dl_phdr_info* info, size_t size, void* data) {
  KilnSegQuery* q = (KilnSegQuery*)data;
  int i;
  (void)size;
  for (i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type != PT_LOAD) continue;
    if (q->addr >= start && q->addr < start + ph->p_memsz) {
      q->readable = q->addr < start + ph->p_filesz ? start + ph->p_filesz - q->addr : 0;
      q->found = 1;
      return 1;
    }
  }
  return 0;
}

static size_t kiln_readable_after(const void* addr) {
  KilnSegQuery q = {(uintptr_t)addr, 0, 0};
  dl_iterate_phdr(kiln_segment_cb, &q);
  return q.found ? q.readable : 0;
}

static int kiln_library_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnLibrary* lib = (KilnLibrary*)self;
  KilnFunc* f;
  void* sym;
  *out = NULL;
  if (lib->names != NULL) {
    const char* p = lib->names;
    const char* end = lib->names + lib->names_len;
    while (p < end && *p && strcmp(p, name) != 0) p += strlen(p) + 1;
    if (p >= end || !*p) return 0;
  }
  if ((sym = dlsym(lib->handle, name)) == NULL) return 0;
  if ((f = kiln_func_method(self, name, NULL)) == NULL) return -1;
  *(void**)&f->cfunc = sym;
  f->lib_error = lib->lib_error;
  f->name = NULL;
  *out = f;
  return 0;
}

static void kiln_library_destroy(KilnModule* self) {
  KilnLibrary* lib = (KilnLibrary*)self;
  if (lib->handle) dlclose(lib->handle);
  free(lib->path);
}

int kiln_library_open(const char* path, KilnModule** out, const uint8_t** blob, size_t* blob_n) {
  KilnLibrary* lib;
  const uint8_t* sym;
  char* real;
  void* names;
  uint64_t nbytes = 0;
  size_t avail, i;
  *out = NULL;
  if (kiln_check_elf(path) != 0 || kiln_check_target_info(path) != 0) return -1;
  lib = (KilnLibrary*)kiln_module_new(sizeof(KilnLibrary), "library");
  if (lib == NULL) return -1;
  lib->base.get_own = kiln_library_get_own;
  lib->base.destroy = kiln_library_destroy;
  if ((lib->path = kiln_strndup(path, strlen(path))) == NULL) goto fail;
  /* RTLD_NODELETE: kernels of a library may have started OpenMP worker threads (libgomp, a
     dependency of the library); unmapping them at dlclose would crash those threads. The
     Python runtime (ctypes) never unloads a library either. */
  /* an absolute name: dlopen searches the library path for a name without a slash */
  if ((real = realpath(path, NULL)) == NULL) {
    kiln_fail("cannot load module: %s cannot be resolved", path);
    goto fail;
  }
  lib->handle = dlopen(real, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
  free(real);
  if (lib->handle == NULL) {
    kiln_fail("cannot dlopen %s: %s", path, dlerror());
    goto fail;
  }
  *(void**)&lib->lib_error = dlsym(lib->handle, "TVMGetLastError");
  if ((names = dlsym(lib->handle, "__kiln_func_names")) != NULL) {
    /* bounded by the segment: an unterminated list is an error, not a read past the end */
    size_t limit = kiln_readable_after(names);
    const char* p = (const char*)names;
    for (i = 0; i < limit && !(p[i] == '\0' && (i == 0 || p[i - 1] == '\0')); ++i) {
    }
    if (i >= limit) {
      kiln_fail("%s: __kiln_func_names: list is not terminated", path);
      goto fail;
    }
    lib->names = p;
    lib->names_len = i + 1;
  }
  if ((sym = (const uint8_t*)dlsym(lib->handle, "__tvm_dev_mblob")) == NULL) {
    kiln_fail("%s has no __tvm_dev_mblob: not a Kiln/TVM library", path);
    goto fail;
  }
  avail = kiln_readable_after(sym);
  for (i = 0; i < 8 && i < avail; ++i) nbytes |= (uint64_t)sym[i] << (8 * i);
  if (avail < 8 || nbytes > avail - 8) {
    kiln_fail("%s: corrupt __tvm_dev_mblob: it claims %llu bytes but at most %zu follow it in "
              "the file", path, (unsigned long long)nbytes, avail >= 8 ? avail - 8 : 0);
    goto fail;
  }
  {
    void** ctx = (void**)dlsym(lib->handle, "__tvm_module_ctx");
    if (ctx != NULL) *ctx = lib;
  }
  *blob = sym + 8;
  *blob_n = (size_t)nbytes;
  *out = &lib->base;
  return 0;
fail:
  kiln_module_release(&lib->base);
  return -1;
}

KILN_EXPORT int TVMModLoadFromFile(const char* file_name, const char* format,
                                   TVMModuleHandle* out) {
  KilnModule* lib;
  const uint8_t* blob;
  size_t n;
  int rc;
  (void)format;
  if (file_name == NULL || out == NULL) return kiln_fail("TVMModLoadFromFile: null argument");
  *out = NULL;
  if (kiln_library_open(file_name, &lib, &blob, &n) != 0) return -1;
  rc = kiln_unpack_imports(blob, n, lib, (KilnModule**)out);
  if (rc != 0) {
    char msg[4096];
    snprintf(msg, sizeof(msg), "%s", TVMGetLastError());
    kiln_fail("%s: %s", file_name, msg);
  }
  kiln_module_release(lib);
  return rc;
}

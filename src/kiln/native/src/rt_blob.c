/*
 * Unpack the imports blob __tvm_dev_mblob into a module tree (TVM's ProcessModuleBlob in
 * src/runtime/library_module.cc; Kiln's kiln/runtime/blob.py, whose checks this file repeats):
 *
 *     payload := u64 num_entries  entry*num_entries
 *     entry   := string "_lib" | string "_import_tree" vec<u64> row_ptr vec<u64> child_indices
 *              | string <type_key> string <module bytes>
 *
 * Every length is checked against the bytes that remain, so a damaged blob is an error naming
 * what was found, never a read out of bounds. Also the stream reader and the NDArray reader of
 * the params format (docs/formats.md §1 and §5), and the CPU-features check of a library's
 * __kiln_target_info record (docs/formats.md §2.1), made before dlopen.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "crt/kiln_crt_json.h"
#include "rt_internal.h"

#define KILN_NDARRAY_MAGIC 0xDD5E40F096B4A13FULL
#define KILN_MAX_NAME 256

/* -- stream reader (little-endian whatever the host) */
static uint64_t kiln_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  size_t i;
  for (i = 0; i < n; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int kiln_truncated(KilnStream* s, size_t need, const char* field) {
  return kiln_fail("%s: truncated: %s needs %zu bytes, %zu left", s->what, field, need, s->left);
}

int kiln_skip(KilnStream* s, size_t n, const char* field) {
  if (s->left < n) return kiln_truncated(s, n, field);
  s->p += n;
  s->left -= n;
  return 0;
}

int kiln_read_u64(KilnStream* s, uint64_t* out, const char* field) {
  if (s->left < 8) return kiln_truncated(s, 8, field);
  *out = kiln_le(s->p, 8);
  return kiln_skip(s, 8, field);
}

int kiln_read_u32(KilnStream* s, uint32_t* out, const char* field) {
  if (s->left < 4) return kiln_truncated(s, 4, field);
  *out = (uint32_t)kiln_le(s->p, 4);
  return kiln_skip(s, 4, field);
}

int kiln_read_bytes(KilnStream* s, const uint8_t** data, size_t* n, const char* field) {
  uint64_t len;
  if (kiln_read_u64(s, &len, field) != 0) return -1;
  if (len > s->left)
    return kiln_fail("%s: corrupt: %s claims %llu bytes, %zu left", s->what, field,
                     (unsigned long long)len, s->left);
  *data = s->p;
  *n = (size_t)len;
  return kiln_skip(s, (size_t)len, field);
}

int kiln_read_count(KilnStream* s, size_t item_size, uint64_t* out, const char* field) {
  if (kiln_read_u64(s, out, field) != 0) return -1;
  if (*out > s->left / (item_size ? item_size : 1))
    return kiln_fail("%s: corrupt: %s %llu, but only %zu bytes left", s->what, field,
                     (unsigned long long)*out, s->left);
  return 0;
}

int kiln_read_ndarray(KilnStream* s, KilnArrayView* a, const char* field) {
  uint64_t magic, reserved, nbytes, expect;
  uint32_t ndim, dtype;
  int i;
  if (kiln_read_u64(s, &magic, field) != 0) return -1;
  if (magic != KILN_NDARRAY_MAGIC)
    return kiln_fail("%s: corrupt %s: bad magic 0x%016llX", s->what, field,
                     (unsigned long long)magic);
  if (kiln_read_u64(s, &reserved, field) != 0 || kiln_skip(s, 8, field) != 0 ||
      kiln_read_u32(s, &ndim, field) != 0 || kiln_read_u32(s, &dtype, field) != 0)
    return -1;
  if (ndim > 32) return kiln_fail("%s: corrupt %s: ndim %d", s->what, field, (int32_t)ndim);
  a->ndim = (int32_t)ndim;
  a->dtype.code = (uint8_t)(dtype & 0xff);
  a->dtype.bits = (uint8_t)((dtype >> 8) & 0xff);
  a->dtype.lanes = (uint16_t)(dtype >> 16);
  if (a->dtype.lanes != 1 || a->dtype.code > 6 ||
      (a->dtype.bits != 8 && a->dtype.bits != 16 && a->dtype.bits != 32 && a->dtype.bits != 64))
    return kiln_fail("%s: corrupt %s: unsupported dtype (code %d, bits %d, lanes %d)", s->what,
                     field, a->dtype.code, a->dtype.bits, a->dtype.lanes);
  expect = a->dtype.bits / 8;
  for (i = 0; i < a->ndim; ++i) {
    uint64_t d;
    if (kiln_read_u64(s, &d, field) != 0) return -1;
    a->shape[i] = (int64_t)d;
    if (a->shape[i] < 0 || (d && expect > UINT64_MAX / 2 / d))
      return kiln_fail("%s: corrupt %s: bad shape", s->what, field);
    expect *= d;
  }
  if (kiln_read_u64(s, &nbytes, field) != 0) return -1;
  if (nbytes != expect)
    return kiln_fail("%s: corrupt %s: nbytes %llu but its shape needs %llu", s->what, field,
                     (unsigned long long)nbytes, (unsigned long long)expect);
  if (nbytes > s->left) return kiln_truncated(s, (size_t)nbytes, field);
  a->data = s->p;
  a->nbytes = nbytes;
  return kiln_skip(s, (size_t)nbytes, field);
}

/* A vec<string> of NUL-free names, duplicates refused (rt_internal.h). */
int kiln_read_names(KilnStream* s, char*** out, size_t* count, const char* field) {
  uint64_t n, i, j;
  const uint8_t* p;
  size_t len;
  if (kiln_read_count(s, 8, &n, field) != 0) return -1;
  if ((*out = (char**)kiln_calloc((size_t)n + 1, sizeof(char*))) == NULL) return -1;
  *count = (size_t)n;
  for (i = 0; i < n; ++i) {
    if (kiln_read_bytes(s, &p, &len, field) != 0) return -1;
    if (memchr(p, 0, len) != NULL) return kiln_fail("%s: corrupt %s: a NUL in a name", s->what, field);
    if (((*out)[i] = kiln_strndup((const char*)p, len)) == NULL) return -1;
    for (j = 0; j < i; ++j)
      if (strcmp((*out)[j], (*out)[i]) == 0)
        return kiln_fail("%s: corrupt %s: '%s' twice", s->what, field, (*out)[i]);
  }
  return 0;
}

/* -- loaders by type_key ("metadata": TVM's name before "const_loader") */
static const struct {
  const char* type_key;
  KilnModuleLoader load;
} kiln_loaders[] = {
    {"GraphExecutorFactory", kiln_load_graph_factory},
    {"const_loader", kiln_load_const_loader},
    {"metadata", kiln_load_const_loader},
    {"kiln_jit", kiln_load_jit},
    {"relax.VMExecutable", kiln_load_vm_executable},
    {"relax.Executable", kiln_load_vm_executable}, /* TVM v0.18's name */
    {"kiln_json", kiln_load_json},
};
#define KILN_NUM_LOADERS (sizeof(kiln_loaders) / sizeof(kiln_loaders[0]))

static int kiln_load_binary(const char* key, const uint8_t* data, size_t n, KilnModule** out) {
  size_t i;
  for (i = 0; i < KILN_NUM_LOADERS; ++i) {
    if (strcmp(kiln_loaders[i].type_key, key) == 0) {
      if (kiln_loaders[i].load(data, n, out) == 0) return 0;
      return kiln_fail("loading module '%s' failed: %s", key, TVMGetLastError());
    }
  }
  return kiln_fail("no loader for module type_key '%s' (this runtime loads GraphExecutorFactory,"
                   " relax.VMExecutable, const_loader, metadata, kiln_jit, kiln_json)", key);
}

/* Iterative depth-first search over the edges between distinct modules (node[i]: the first
   entry holding entry i's module): 0 when acyclic. O(modules + edges): the edges are regrouped
   by node first (a long crafted chain must not make this quadratic). */
static int kiln_check_acyclic(size_t n, const uint64_t* row_ptr, const uint64_t* child,
                              size_t nchild, const size_t* node) {
  size_t* start = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  size_t* fill = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  size_t* edge = (size_t*)kiln_calloc(nchild + 1, sizeof(size_t));
  size_t* stack = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  uint8_t* state = (uint8_t*)kiln_calloc(n + 1, 1); /* 1 on the path, 2 done */
  size_t i, root;
  uint64_t e;
  int rc = 0;
  if (start == NULL || fill == NULL || edge == NULL || stack == NULL || state == NULL) rc = -1;
  for (i = 0; rc == 0 && i < n; ++i) start[node[i] + 1] += (size_t)(row_ptr[i + 1] - row_ptr[i]);
  for (i = 0; rc == 0 && i < n; ++i) start[i + 1] += start[i];
  for (i = 0; rc == 0 && i < n; ++i) {
    for (e = row_ptr[i]; e < row_ptr[i + 1]; ++e)
      edge[start[node[i]] + fill[node[i]]++] = node[child[e]];
  }
  for (i = 0; rc == 0 && i < n; ++i) fill[i] = start[i]; /* fill: next edge to visit */
  for (root = 0; rc == 0 && root < n; ++root) {
    size_t depth = 1;
    if (node[root] != root || state[root]) continue;
    stack[0] = root;
    state[root] = 1;
    while (depth > 0 && rc == 0) {
      size_t cur = stack[depth - 1], next;
      if (fill[cur] == start[cur + 1]) {
        state[cur] = 2;
        --depth;
        continue;
      }
      next = edge[fill[cur]++];
      if (state[next] == 1) {
        rc = kiln_fail("corrupt import tree: a cycle through modules %zu and %zu", cur, next);
      } else if (state[next] == 0) {
        state[next] = 1;
        stack[depth++] = next;
      }
    }
  }
  free(start);
  free(fill);
  free(edge);
  free(stack);
  free(state);
  return rc;
}

static int kiln_link_imports(KilnModule** mods, size_t n, KilnModule* lib, const uint64_t* row_ptr,
                             size_t nrow, const uint64_t* child, size_t nchild) {
  size_t i, j;
  size_t* node;
  int rc;
  if (nrow != n + 1 || row_ptr[0] != 0 || row_ptr[n] != nchild)
    return kiln_fail("corrupt import tree: row_ptr does not fit %zu modules and %zu children", n,
                     nchild);
  for (i = 0; i < n; ++i)
    if (row_ptr[i] > row_ptr[i + 1])
      return kiln_fail("corrupt import tree: row_ptr is not monotone");
  for (i = 0; i < nchild; ++i)
    if (child[i] >= n)
      return kiln_fail("corrupt import tree: child index out of range (have %zu modules)", n);
  /* modules by identity: only the library can stand in several entries (each loader returns a
     new module), so an entry maps to itself or to the library's first entry */
  if ((node = (size_t*)kiln_calloc(n, sizeof(size_t))) == NULL) return -1;
  for (i = 0, j = n; i < n; ++i) {
    node[i] = i;
    if (mods[i] == lib) {
      if (j == n) j = i;
      node[i] = j;
    }
  }
  rc = kiln_check_acyclic(n, row_ptr, child, nchild, node);
  free(node);
  for (i = 0; rc == 0 && i < n; ++i)
    for (j = (size_t)row_ptr[i]; rc == 0 && j < row_ptr[i + 1]; ++j)
      rc = kiln_module_add_import(mods[i], mods[child[j]]);
  return rc;
}

/* A vec<u64>, borrowed as raw little-endian words copied out. */
static int kiln_read_vec_u64(KilnStream* s, uint64_t** out, size_t* n, const char* field) {
  uint64_t count, i;
  if (kiln_read_count(s, 8, &count, field) != 0) return -1;
  if ((*out = (uint64_t*)kiln_calloc((size_t)count + 1, sizeof(uint64_t))) == NULL) return -1;
  for (i = 0; i < count; ++i) kiln_read_u64(s, &(*out)[i], field);
  *n = (size_t)count;
  return 0;
}

int kiln_unpack_imports(const uint8_t* payload, size_t nbytes, KilnModule* lib,
                        KilnModule** out) {
  KilnStream s = {payload, nbytes, "__tvm_dev_mblob"};
  uint64_t num_entries = 0, i;
  KilnModule** mods = NULL;
  size_t nmods = 0, nrow = 0, nchild = 0;
  uint64_t *row_ptr = NULL, *child = NULL;
  int have_tree = 0, rc = -1;
  *out = NULL;
  if (kiln_read_count(&s, 8, &num_entries, "entry count") != 0) return -1;
  if ((mods = (KilnModule**)kiln_calloc((size_t)num_entries + 1, sizeof(*mods))) == NULL)
    return -1;
  for (i = 0; i < num_entries; ++i) {
    const uint8_t* key;
    size_t key_n;
    char name[KILN_MAX_NAME];
    if (kiln_read_bytes(&s, &key, &key_n, "entry key") != 0) goto done;
    if (key_n >= sizeof(name) || memchr(key, 0, key_n) != NULL) {
      kiln_fail("__tvm_dev_mblob: corrupt: entry %llu key is not a type_key",
                (unsigned long long)i);
      goto done;
    }
    memcpy(name, key, key_n);
    name[key_n] = '\0';
    if (have_tree) {
      kiln_fail("__tvm_dev_mblob: corrupt: entry '%s' after _import_tree", name);
      goto done;
    }
    if (strcmp(name, "_lib") == 0) {
      if (lib == NULL) {
        kiln_fail("__tvm_dev_mblob: blob refers to _lib but there is no library module");
        goto done;
      }
      kiln_module_retain(lib);
      mods[nmods++] = lib;
    } else if (strcmp(name, "_import_tree") == 0) {
      if (kiln_read_vec_u64(&s, &row_ptr, &nrow, "import tree row_ptr") != 0 ||
          kiln_read_vec_u64(&s, &child, &nchild, "import tree child_indices") != 0)
        goto done;
      have_tree = 1;
    } else {
      const uint8_t* data;
      size_t n;
      if (kiln_read_bytes(&s, &data, &n, "module bytes") != 0 ||
          kiln_load_binary(name, data, n, &mods[nmods]) != 0)
        goto done;
      ++nmods;
    }
  }
  if (s.left) {
    kiln_fail("__tvm_dev_mblob: corrupt: %zu trailing bytes after %llu entries", s.left,
              (unsigned long long)num_entries);
    goto done;
  }
  if (nmods == 0) {
    if (lib == NULL) {
      kiln_fail("__tvm_dev_mblob: blob holds no module");
      goto done;
    }
    kiln_module_retain(lib);
    *out = lib;
    rc = 0;
    goto done;
  }
  if (have_tree) {
    if (kiln_link_imports(mods, nmods, lib, row_ptr, nrow, child, nchild) != 0) goto done;
  } else if (lib != NULL && nmods > 1) { /* TVM < 0.7: the library imports every other module */
    for (i = 0; i < nmods; ++i)
      if (mods[i] != lib && kiln_module_add_import(lib, mods[i]) != 0) goto done;
  }
  kiln_module_retain(mods[0]);
  *out = mods[0];
  rc = 0;
done:
  for (i = 0; i < nmods; ++i) kiln_module_release(mods[i]);
  free(mods);
  free(row_ptr);
  free(child);
  return rc;
}

KILN_EXPORT int KilnModLoadFromBlob(const void* payload, size_t nbytes, TVMModuleHandle lib,
                                    TVMModuleHandle* out) {
  if ((payload == NULL && nbytes) || out == NULL)
    return kiln_fail("KilnModLoadFromBlob: null argument");
  return kiln_unpack_imports((const uint8_t*)payload, nbytes, (KilnModule*)lib,
                             (KilnModule**)out);
}

/* ---- __kiln_target_info: the CPU-features check, before dlopen (kiln/runtime/cpu_features.py,
   docs/decisions/031-cpu-features-check.md). The record is read from the file's symbol table
   (.dynsym), so no constructor of a library built for another CPU runs first. */
#define KILN_MAX_TARGET_INFO 65536
#define KILN_MAX_CPUINFO (1 << 20)

/* feature (the record's name, LLVM's) -> its word in /proc/cpuinfo; the same table as
   CPUINFO_NAMES in kiln/runtime/cpu_features.py */
static const char* const kiln_cpuinfo_names[][2] = {
#if defined(__x86_64__)
    {"sse4.2", "sse4_2"}, {"popcnt", "popcnt"}, {"avx", "avx"}, {"avx2", "avx2"},
    {"fma", "fma"}, {"f16c", "f16c"}, {"bmi2", "bmi2"}, {"avx512f", "avx512f"},
    {"avx512bw", "avx512bw"}, {"avx512cd", "avx512cd"}, {"avx512dq", "avx512dq"},
    {"avx512vl", "avx512vl"}, {"avx512vnni", "avx512_vnni"}, {"avx512bf16", "avx512_bf16"},
    {"avx512fp16", "avx512_fp16"}, {"avx512vbmi", "avx512vbmi"}, {"avx512vbmi2", "avx512_vbmi2"},
    {"avx512bitalg", "avx512_bitalg"}, {"avx512vpopcntdq", "avx512_vpopcntdq"},
    {"avx512ifma", "avx512ifma"}, {"avxvnni", "avx_vnni"}, {"amx-tile", "amx_tile"},
    {"amx-int8", "amx_int8"}, {"amx-bf16", "amx_bf16"},
#define KILN_CPUINFO_KEY "flags"
#elif defined(__aarch64__)
    {"neon", "asimd"}, {"fullfp16", "asimdhp"}, {"dotprod", "asimddp"}, {"i8mm", "i8mm"},
    {"bf16", "bf16"}, {"sve", "sve"}, {"sve2", "sve2"},
#define KILN_CPUINFO_KEY "Features"
#endif
    {NULL, NULL}};

/* The bytes of data symbol `name` in the file (at most `limit`), NUL-terminated in a malloc'ed
   buffer, or NULL when the file defines no such symbol or its tables are unreadable. */
static char* kiln_file_symbol(const char* path, const char* name, size_t limit) {
  FILE* f = fopen(path, "rb");
  ElfW(Ehdr) eh;
  ElfW(Shdr)* sh = NULL;
  char *strtab = NULL, *out = NULL;
  ElfW(Sym)* syms = NULL;
  struct stat st;
  size_t k, i, nlen = strlen(name);
  int kinds[2] = {SHT_DYNSYM, SHT_SYMTAB}, pass, done = 0;
  if (f == NULL) return NULL;
  if (fstat(fileno(f), &st) != 0 || fread(&eh, 1, sizeof(eh), f) != sizeof(eh) ||
      eh.e_shnum == 0 || eh.e_shentsize != sizeof(ElfW(Shdr)) ||
      (uint64_t)eh.e_shoff + (uint64_t)eh.e_shnum * sizeof(ElfW(Shdr)) > (uint64_t)st.st_size ||
      (sh = (ElfW(Shdr)*)calloc(eh.e_shnum, sizeof(ElfW(Shdr)))) == NULL ||
      fseek(f, (long)eh.e_shoff, SEEK_SET) != 0 ||
      fread(sh, sizeof(ElfW(Shdr)), eh.e_shnum, f) != eh.e_shnum)
    goto done;
  for (pass = 0; pass < 2 && !done; ++pass) {
    for (k = 0; k < eh.e_shnum && !done; ++k) {
      const ElfW(Shdr)* s = &sh[k];
      const ElfW(Shdr)* str;
      size_t nsym;
      if (s->sh_type != (ElfW(Word))kinds[pass] || s->sh_link >= eh.e_shnum ||
          (uint64_t)s->sh_offset + s->sh_size > (uint64_t)st.st_size)
        continue;
      str = &sh[s->sh_link];
      if ((uint64_t)str->sh_offset + str->sh_size > (uint64_t)st.st_size) continue;
      nsym = s->sh_size / sizeof(ElfW(Sym));
      free(strtab);
      free(syms);
      strtab = (char*)malloc(str->sh_size + 1);
      syms = (ElfW(Sym)*)malloc(nsym * sizeof(ElfW(Sym)) + 1);
      if (strtab == NULL || syms == NULL || fseek(f, (long)str->sh_offset, SEEK_SET) != 0 ||
          fread(strtab, 1, str->sh_size, f) != str->sh_size ||
          fseek(f, (long)s->sh_offset, SEEK_SET) != 0 ||
          fread(syms, sizeof(ElfW(Sym)), nsym, f) != nsym)
        goto done;
      for (i = 0; i < nsym; ++i) {
        const ElfW(Sym)* y = &syms[i];
        const ElfW(Shdr)* d;
        uint64_t start, n;
        if (y->st_name >= str->sh_size || str->sh_size - y->st_name < nlen + 1 ||
            memcmp(strtab + y->st_name, name, nlen + 1) != 0)
          continue;
        done = 1;
        if (y->st_shndx == SHN_UNDEF || y->st_shndx >= eh.e_shnum) break;
        d = &sh[y->st_shndx];
        start = y->st_value - d->sh_addr;
        if (d->sh_type == SHT_NOBITS || y->st_value < d->sh_addr || start > d->sh_size ||
            (uint64_t)d->sh_offset + d->sh_size > (uint64_t)st.st_size)
          break;
        n = y->st_size ? y->st_size : limit;
        if (n > limit) n = limit;
        if (n > d->sh_size - start) n = d->sh_size - start;
        if ((out = (char*)calloc((size_t)n + 1, 1)) == NULL ||
            fseek(f, (long)(d->sh_offset + start), SEEK_SET) != 0 ||
            fread(out, 1, (size_t)n, f) != (size_t)n) {
          free(out);
          out = NULL;
        }
        break;
      }
    }
  }
done:
  free(sh);
  free(strtab);
  free(syms);
  fclose(f);
  return out;
}

/* Whether word `w` (length n) is one of the words of the cpuinfo line `flags`. */
static int kiln_has_word(const char* flags, const char* w) {
  size_t n = strlen(w);
  const char* p = flags;
  while ((p = strstr(p, w)) != NULL) {
    if ((p == flags || p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\t' ||
                                                          p[n] == '\n' || p[n] == '\0'))
      return 1;
    p += n;
  }
  return 0;
}

/* The first /proc/cpuinfo line `key : ...` (its value, malloc'ed), or NULL. */
static char* kiln_cpuinfo_line(const char* key) {
  FILE* f = fopen("/proc/cpuinfo", "r");
  char* line = NULL;
  size_t cap = 0, klen = strlen(key);
  ssize_t n;
  if (f == NULL) return NULL;
  while ((n = getline(&line, &cap, f)) > 0 && n < KILN_MAX_CPUINFO) {
    char* colon;
    if (strncmp(line, key, klen) != 0 || (colon = strchr(line + klen, ':')) == NULL) continue;
    if (strspn(line + klen, " \t") != (size_t)(colon - line - (ptrdiff_t)klen)) continue;
    memmove(line, colon + 1, strlen(colon + 1) + 1);
    fclose(f);
    return line;
  }
  free(line);
  fclose(f);
  return NULL;
}

int kiln_check_target_info(const char* path) {
  char *info = kiln_file_symbol(path, "__kiln_target_info", KILN_MAX_TARGET_INFO), *flags;
  KilnJsonToken* toks = NULL;
  char missing[1024] = "", has[1024] = "";
  int ntok, feats, i, j, rc = 0;
  if (info == NULL) return 0; /* written before the record existed, or not by Kiln */
  if ((ntok = KilnJson_Parse(info, strlen(info), NULL, 0)) < 0 ||
      (toks = (KilnJsonToken*)kiln_calloc((size_t)ntok + 1, sizeof(*toks))) == NULL ||
      KilnJson_Parse(info, strlen(info), toks, ntok) < 0 || toks[0].type != KILN_JSON_OBJECT ||
      (feats = KilnJson_Get(info, toks, 0, "features")) < 0 || toks[feats].type != KILN_JSON_ARRAY) {
    rc = kiln_fail("%s: corrupt __kiln_target_info: no 'features' list", path);
    goto done;
  }
#ifdef KILN_CPUINFO_KEY
  if ((flags = kiln_cpuinfo_line(KILN_CPUINFO_KEY)) == NULL) goto done; /* cannot tell */
  for (i = 0; i < toks[feats].size; ++i) {
    int t = KilnJson_At(toks, feats, i);
    for (j = 0; t >= 0 && kiln_cpuinfo_names[j][0] != NULL; ++j) {
      if (KilnJson_Equals(info, toks, t, kiln_cpuinfo_names[j][0]) &&
          !kiln_has_word(flags, kiln_cpuinfo_names[j][1]) &&
          strlen(missing) + strlen(kiln_cpuinfo_names[j][0]) + 3 < sizeof(missing)) {
        strcat(strcat(missing, *missing ? ", " : ""), kiln_cpuinfo_names[j][0]);
      }
    }
  }
  for (j = 0; kiln_cpuinfo_names[j][0] != NULL; ++j) {
    if (kiln_has_word(flags, kiln_cpuinfo_names[j][1]) &&
        strlen(has) + strlen(kiln_cpuinfo_names[j][0]) + 3 < sizeof(has))
      strcat(strcat(has, *has ? ", " : ""), kiln_cpuinfo_names[j][0]);
  }
  free(flags);
  if (*missing) {
    int t = KilnJson_Get(info, toks, 0, "target");
    int tn = t >= 0 && toks[t].type == KILN_JSON_STRING ? toks[t].end - toks[t].start : 0;
    rc = kiln_fail("%s needs %s; this CPU has %s. It was built for another CPU%s%.*s%s: rebuild "
                   "it for this one (-mcpu=native)%s", path, missing,
                   *has ? has : "none of the recorded features", tn ? " (target '" : "", tn,
                   tn ? info + toks[t].start : "", tn ? "')" : "",
#if defined(__x86_64__)
                   " or for every x86-64 CPU (-mcpu=portable)"
#else
                   ""
#endif
    );
  }
#else
  (void)i, (void)j, (void)flags, (void)missing, (void)has;
#endif
done:
  free(toks);
  free(info);
  return rc;
}

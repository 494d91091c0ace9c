/*
 * The const loader (metadata) module, type_key "const_loader" (TVM's older "metadata" loads
 * too): constants for external (BYOC) modules, handed to each one's __init_<symbol> once before
 * its first use. TVM's src/runtime/const_loader_module.cc; Kiln's
 * kiln/runtime/const_loader_module.py, whose checks and calling convention (one tensor argument
 * per constant, in get_const_vars order) this file repeats. Bytes (docs/formats.md §7):
 *
 *     vec<string> variables | u64 n | n x NDArray | vec<string> symbols | u64 m | m x vec<string>
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

typedef struct {
  char* name;
  size_t num_consts;
  size_t* consts; /* indices into the constants */
  int initialized;
} KilnConstSymbol;

typedef struct {
  KilnModule base;
  size_t num_consts;
  char** names;
  DLTensor** arrays;
  size_t num_symbols;
  KilnConstSymbol* symbols;
  pthread_mutex_t lock;
} KilnConstLoader;

/* __init_<symbol> in the imports (depth-first), called with the symbol's constants. */
static int kiln_const_init(KilnConstLoader* c, KilnConstSymbol* sym) {
  char init_name[300];
  KilnFunc* init = NULL;
  TVMValue args[64], ret;
  int codes[64], ret_code, i, rc;
  snprintf(init_name, sizeof(init_name), "__init_%s", sym->name);
  if (sym->num_consts > 64)
    return kiln_fail("const_loader: symbol '%s' takes %zu constants (at most 64 here)",
                     sym->name, sym->num_consts);
  for (i = 0; init == NULL && i < c->base.num_imports; ++i)
    if (kiln_module_get_function(c->base.imports[i], init_name, 1, &init) != 0) return -1;
  if (init == NULL)
    return kiln_fail("const_loader: no imported module defines '%s' to receive the constants "
                     "of symbol '%s'", init_name, sym->name);
  for (i = 0; i < (int)sym->num_consts; ++i) {
    args[i].v_handle = c->arrays[sym->consts[i]];
    codes[i] = kTVMDLTensorHandle;
  }
  rc = kiln_func_call(init, args, codes, (int)sym->num_consts, &ret, &ret_code);
  kiln_func_release(init);
  if (rc == 0 && ret_code == kTVMArgInt && ret.v_int64 != 0)
    rc = kiln_fail("const_loader: %s returned %lld (expected 0)", init_name,
                   (long long)ret.v_int64);
  return rc;
}

static int kiln_const_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnConstLoader* c = (KilnConstLoader*)self;
  size_t s;
  int i;
  *out = NULL;
  for (s = 0; s < c->num_symbols; ++s) {
    KilnConstSymbol* sym = &c->symbols[s];
    if (strcmp(sym->name, name) != 0) continue;
    pthread_mutex_lock(&c->lock);
    if (!sym->initialized && kiln_const_init(c, sym) != 0) {
      pthread_mutex_unlock(&c->lock);
      return -1;
    }
    sym->initialized = 1;
    pthread_mutex_unlock(&c->lock);
    break;
  }
  for (i = 0; *out == NULL && i < self->num_imports; ++i)
    if (kiln_module_get_function(self->imports[i], name, 1, out) != 0) return -1;
  return 0;
}

static void kiln_const_destroy(KilnModule* self) {
  KilnConstLoader* c = (KilnConstLoader*)self;
  size_t i;
  for (i = 0; i < c->num_consts; ++i) {
    if (c->names) free(c->names[i]);
    if (c->arrays) TVMArrayFree(c->arrays[i]);
  }
  for (i = 0; c->symbols && i < c->num_symbols; ++i) {
    free(c->symbols[i].name);
    free(c->symbols[i].consts);
  }
  free(c->names);
  free(c->arrays);
  free(c->symbols);
  pthread_mutex_destroy(&c->lock);
}

int kiln_load_const_loader(const uint8_t* data, size_t n, KilnModule** out) {
  KilnStream s = {data, n, "const_loader module"};
  KilnConstLoader* c = (KilnConstLoader*)kiln_module_new(sizeof(KilnConstLoader), "const_loader");
  char** symbols = NULL;
  uint64_t count;
  size_t i, nsym = 0;
  int rc = -1;
  *out = NULL;
  if (c == NULL) return -1;
  pthread_mutex_init(&c->lock, NULL);
  c->base.get_own = kiln_const_get_own;
  c->base.destroy = kiln_const_destroy;
  if (kiln_read_names(&s, &c->names, &c->num_consts, "variables") != 0) {
    c->num_consts = c->names ? c->num_consts : 0;
    goto done;
  }
  if ((c->arrays = (DLTensor**)kiln_calloc(c->num_consts + 1, sizeof(DLTensor*))) == NULL ||
      kiln_read_u64(&s, &count, "constant count") != 0)
    goto done;
  if (count != c->num_consts) {
    kiln_fail("%s: corrupt: %llu constants for %zu variable names", s.what,
              (unsigned long long)count, c->num_consts);
    goto done;
  }
  for (i = 0; i < c->num_consts; ++i) {
    KilnArrayView a;
    if (kiln_read_ndarray(&s, &a, "constant") != 0 ||
        TVMArrayAlloc(a.shape, a.ndim, a.dtype.code, a.dtype.bits, a.dtype.lanes, kDLCPU, 0,
                      &c->arrays[i]) != 0)
      goto done;
    if (a.nbytes) memcpy(c->arrays[i]->data, a.data, (size_t)a.nbytes);
  }
  if (kiln_read_names(&s, &symbols, &nsym, "symbols") != 0 ||
      kiln_read_u64(&s, &count, "symbol count") != 0)
    goto done;
  if (count != nsym) {
    kiln_fail("%s: corrupt: %llu constant lists for %zu symbols", s.what,
              (unsigned long long)count, nsym);
    goto done;
  }
  if ((c->symbols = (KilnConstSymbol*)kiln_calloc(nsym + 1, sizeof(KilnConstSymbol))) == NULL)
    goto done;
  c->num_symbols = nsym;
  for (i = 0; i < nsym; ++i) {
    char** vars = NULL;
    size_t nvars = 0, k, j;
    KilnConstSymbol* sym = &c->symbols[i];
    sym->name = symbols[i];
    symbols[i] = NULL;
    rc = kiln_read_names(&s, &vars, &nvars, "constants of a symbol");
    if (rc == 0 && (sym->consts = (size_t*)kiln_calloc(nvars + 1, sizeof(size_t))) == NULL) rc = -1;
    for (k = 0; rc == 0 && k < nvars; ++k) {
      for (j = 0; j < c->num_consts && strcmp(c->names[j], vars[k]) != 0; ++j) {
      }
      if (j == c->num_consts)
        rc = kiln_fail("%s: corrupt: symbol '%s' needs constant '%s', which is not stored",
                       s.what, sym->name, vars[k]);
      sym->consts[k] = j;
    }
    sym->num_consts = nvars;
    for (k = 0; vars && k < nvars; ++k) free(vars[k]);
    free(vars);
    if (rc != 0) goto done;
    rc = -1;
  }
  if (s.left) {
    kiln_fail("%s: %zu unexpected trailing bytes", s.what, s.left);
    goto done;
  }
  rc = 0;
  *out = &c->base;
done:
  for (i = 0; symbols && i < nsym; ++i) free(symbols[i]);
  free(symbols);
  if (rc != 0) kiln_module_release(&c->base);
  return rc;
}

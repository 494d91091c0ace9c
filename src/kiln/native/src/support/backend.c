/*
 * Kiln backend support, compiled into every exported library so an artifact needs no runtime
 * library: the packed-function error buffer, the workspace allocator, the graph executor's
 * batched call loop, and the thread pool behind TVMBackendParallelLaunch (C and LLVM kernels).
 * Follows TVM's src/runtime/c_runtime_api.cc (TVMAPISetLastError),
 * include/tvm/runtime/c_backend_api.h (TVMBackendAllocWorkspace, TVMBackendParallelLaunch) and
 * src/runtime/thread_pool.cc; see docs/formats.md §3.5.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT, syscall */
#include <kiln/c_runtime_api.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define KILN_EXPORT __attribute__((visibility("default")))
#define KILN_WORKSPACE_ALIGN 64
#define KILN_ERROR_SIZE 2048

/* Thread-local, like TVM's: a kernel failing on one thread never clobbers another's message. */
static __thread char kiln_last_error[KILN_ERROR_SIZE];

KILN_EXPORT void TVMAPISetLastError(const char* msg) {
  if (msg == NULL) {
    kiln_last_error[0] = '\0';
    return;
  }
  strncpy(kiln_last_error, msg, KILN_ERROR_SIZE - 1);
  kiln_last_error[KILN_ERROR_SIZE - 1] = '\0';
}

KILN_EXPORT const char* TVMGetLastError(void) { return kiln_last_error; }

KILN_EXPORT void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                           int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id;
  (void)dtype_code_hint;
  (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    TVMAPISetLastError("TVMBackendAllocWorkspace: only CPU workspaces are supported");
    return NULL;
  }
  /* posix_memalign (POSIX.1-2001), not C11's aligned_alloc: the support code is compiled as
   * gnu99, where <stdlib.h> does not declare aligned_alloc (an implicit declaration is an error
   * in GCC 14 and Clang 16). Sizes are rounded up to whole alignment units. */
  void* ptr = NULL;
  if (nbytes <= (uint64_t)SIZE_MAX - KILN_WORKSPACE_ALIGN) {
    size_t size = ((size_t)nbytes + KILN_WORKSPACE_ALIGN - 1) &
                  ~(size_t)(KILN_WORKSPACE_ALIGN - 1);
    if (size == 0) size = KILN_WORKSPACE_ALIGN;
    if (posix_memalign(&ptr, KILN_WORKSPACE_ALIGN, size) != 0) ptr = NULL;
  }
  if (ptr == NULL) TVMAPISetLastError("TVMBackendAllocWorkspace: out of memory");
  return ptr;
}

KILN_EXPORT int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  free(ptr);
  return 0;
}

/* One prepared packed call of the graph executor (kiln/runtime/graph_executor/call_batch.py mirrors it). */
typedef struct {
  TVMBackendPackedCFunc func;
  TVMValue* args;
  int* type_codes;
  int64_t num_args;
} KilnPackedCall;

/* Run calls[0..count) in order, stopping at the first failure: returns 0, or the failing
 * call's status with *failed set to its index (its message is in its own library's buffer).
 * One call from Python per run instead of one per kernel (~1 us each through ctypes). */
KILN_EXPORT int KilnRunPackedCalls(const KilnPackedCall* calls, int64_t count, int64_t* failed) {
  TVMValue ret;
  int ret_code;
  for (int64_t i = 0; i < count; ++i) {
    int rc = calls[i].func(calls[i].args, calls[i].type_codes, (int)calls[i].num_args, &ret,
                           &ret_code, NULL);
    if (rc != 0) {
      *failed = i;
      return rc;
    }
  }
  return 0;
}

/* Packed function: copy the bytes of tensor args[0] into tensor args[1] (same size). The VM's
 * replay writes a decoder's new key/value rows behind its cache with it, inside a batch of
 * KilnRunPackedCalls (kiln/runtime/vm/replay.py). */
KILN_EXPORT int KilnCopyTensor(TVMValue* args, int* type_codes, int num_args, TVMValue* ret,
                               int* ret_code, void* resource) {
  (void)ret;
  (void)ret_code;
  (void)resource;
  if (num_args != 2 || type_codes[0] != kTVMDLTensorHandle ||
      type_codes[1] != kTVMDLTensorHandle) {
    TVMAPISetLastError("KilnCopyTensor: expects two tensors");
    return -1;
  }
  const DLTensor* src = (const DLTensor*)args[0].v_handle;
  DLTensor* dst = (DLTensor*)args[1].v_handle;
  uint64_t n = (uint64_t)(src->dtype.bits * src->dtype.lanes + 7) / 8;
  for (int i = 0; i < src->ndim; ++i) n *= (uint64_t)src->shape[i];
  if (n) memcpy(dst->data, src->data, n);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The thread pool behind TVMBackendParallelLaunch (docs/decisions/020-thread-pool.md).
 *
 * After TVM's src/runtime/thread_pool.cc: persistent workers, the calling thread runs task 0,
 * worker i runs task i, each worker has its own mailbox (TVM: one SPSC queue per worker) so a
 * launch touches only the workers it uses, and a waiting thread spins a bounded time before it
 * sleeps. Unlike TVM's launcher, which yields in a loop until the tasks are done, every wait
 * here (worker for a job, launcher for the workers, barrier) ends asleep on a futex, and the
 * launcher runs the tasks of workers that have not started yet itself: on cores shared with
 * other processes no thread burns its time slice waiting for a descheduled one (issue 17:
 * OpenMP's default busy-wait gave 300 ms spikes on a 1.3 ms model under load).
 *
 * Each exported library holds its own pool (the kernels bind to their library's symbols with
 * -Bsymbolic); idle workers sleep, so several libraries in one process cost threads, not CPU.
 * ------------------------------------------------------------------------------------------- */

#define KILN_MAX_THREADS 256
/* Default spin before sleeping, microseconds ($KILN_SPIN_US): longer than the gap between two
 * kernels of a model run (a few us), so the workers stay awake through a run, and short enough
 * that an idle pool gives its cores back at once. */
#define KILN_SPIN_US 100
#define KILN_CACHE_LINE 64

/* A word some threads wait on for a change, and how many of them are asleep on it (so the
 * writer makes the wake syscall only when someone sleeps); in a worker's mailbox, claim is set
 * by whichever thread runs the worker's task of the current job (the worker or the launcher). */
typedef struct {
  uint32_t word;
  uint32_t sleepers;
  uint32_t claim;
} __attribute__((aligned(KILN_CACHE_LINE))) KilnWaitWord;

typedef struct {
  KilnWaitWord gen;  /* bumped when the last task arrives */
  uint32_t arrived;
} KilnBarrier;

static struct {
  pthread_mutex_t lock;       /* one launch at a time on the workers; held by the launcher */
  pthread_mutex_t init_lock;  /* guards lazy start of the workers */
  int team;                   /* threads per launch: KILN_NUM_THREADS, else CPUs in affinity */
  int started;                /* workers running (task ids 1..started) */
  uint64_t spin_ns;           /* how long a waiting thread spins before it sleeps */
  pthread_t threads[KILN_MAX_THREADS];
  KilnWaitWord mailbox[KILN_MAX_THREADS]; /* worker i's job number (and a shutdown) */
  /* the current job: written by the launcher before the mailboxes are bumped */
  FTVMParallelLambda flambda;
  void* cdata;
  int num_task;
  int shutdown;
  KilnWaitWord pending; /* tasks 1.. not yet finished; the launcher waits for 0 */
  KilnBarrier barrier;
  uint32_t failed;
  char message[KILN_ERROR_SIZE]; /* the first failing task's error */
} kiln_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .init_lock = PTHREAD_MUTEX_INITIALIZER};

/* Set on a thread while it runs a task (workers: always): a launch from a task runs serially. */
static __thread int kiln_in_task;

static inline void kiln_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

static uint64_t kiln_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleep while *word == expected (returns at once if it differs; may return spuriously). */
static void kiln_futex_wait(uint32_t* word, uint32_t expected) {
#ifdef __linux__
  syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
#else
  (void)word;
  (void)expected;
  struct timespec ts = {0, 50000}; /* no futex: poll every 50 us */
  nanosleep(&ts, NULL);
#endif
}

static void kiln_futex_wake(uint32_t* word) {
#ifdef __linux__
  syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
  (void)word;
#endif
}

/* Wait until done(w->word, arg): spin with a pause instruction for up to spin_ns (yielding the
 * CPU between checks once a fifth of it has passed), then sleep on the futex. The sleeper
 * count and the word are both sequentially consistent (a Dekker pair with kiln_publish): the
 * writer either sees the sleeper or the sleeper sees the new word, and FUTEX_WAIT itself
 * re-checks the word, so no wake-up is lost. */
static void kiln_wait(KilnWaitWord* w, int (*done)(uint32_t, uint32_t), uint32_t arg) {
  uint64_t start = 0, spin = kiln_pool.spin_ns;
  for (uint32_t i = 1;; ++i) {
    if (done(__atomic_load_n(&w->word, __ATOMIC_ACQUIRE), arg)) return;
    kiln_cpu_relax();
    if ((i & 63) == 0) {
      uint64_t now = kiln_now_ns();
      if (start == 0) start = now;
      if (now - start >= spin) break;
      if (now - start >= spin / 5) sched_yield();
    }
  }
  __atomic_fetch_add(&w->sleepers, 1, __ATOMIC_SEQ_CST);
  uint32_t v;
  while (!done(v = __atomic_load_n(&w->word, __ATOMIC_SEQ_CST), arg)) kiln_futex_wait(&w->word, v);
  __atomic_fetch_sub(&w->sleepers, 1, __ATOMIC_SEQ_CST);
}

static int kiln_changed(uint32_t word, uint32_t old) { return word != old; }
static int kiln_is_zero(uint32_t word, uint32_t unused) { (void)unused; return word == 0; }

/* After changing w->word (sequentially consistent): wake its sleepers, if any. */
static void kiln_publish(KilnWaitWord* w) {
  if (__atomic_load_n(&w->sleepers, __ATOMIC_SEQ_CST) != 0) kiln_futex_wake(&w->word);
}

/* Record a failed task's message (the thread's own error buffer) if it is the first. */
static void kiln_task_failed(void) {
  if (__atomic_exchange_n(&kiln_pool.failed, 1, __ATOMIC_ACQ_REL) == 0)
    memcpy(kiln_pool.message, kiln_last_error, KILN_ERROR_SIZE);
}

/* Claim task_id of the current job: true for the one thread that gets to run it. */
static int kiln_claim(int task_id) {
  return __atomic_exchange_n(&kiln_pool.mailbox[task_id].claim, 1, __ATOMIC_ACQ_REL) == 0;
}

static void kiln_run_task(int task_id) {
  TVMParallelGroupEnv env = {&kiln_pool.barrier, kiln_pool.num_task};
  if (kiln_pool.flambda(task_id, &env, kiln_pool.cdata) != 0) kiln_task_failed();
  if (__atomic_sub_fetch(&kiln_pool.pending.word, 1, __ATOMIC_SEQ_CST) == 0)
    kiln_publish(&kiln_pool.pending);
}

static void* kiln_worker_main(void* arg) {
  int task_id = (int)(intptr_t)arg;
  KilnWaitWord* box = &kiln_pool.mailbox[task_id];
  uint32_t seen = 0; /* the mailbox was 0 when the thread was created */
  kiln_in_task = 1;
  for (;;) {
    kiln_wait(box, kiln_changed, seen);
    seen = __atomic_load_n(&box->word, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&kiln_pool.shutdown, __ATOMIC_ACQUIRE)) return NULL;
    if (kiln_claim(task_id)) kiln_run_task(task_id); /* else the launcher ran it */
  }
}

/* The team size: KILN_NUM_THREADS when set (like TVM_NUM_THREADS), else the CPUs this process
 * may run on (its affinity mask: taskset, a container's cpuset), not every CPU online. */
static int kiln_team_size(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    long n = strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0) return n < KILN_MAX_THREADS ? (int)n : KILN_MAX_THREADS;
  }
  int n = 0;
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n < KILN_MAX_THREADS ? n : KILN_MAX_THREADS);
}

/* Start workers up to task id want - 1 (lazily, on the first launch that needs them); returns
 * how many tasks a launch can have now (fewer when a thread cannot be created). */
static int kiln_start_workers(int want) {
  pthread_mutex_lock(&kiln_pool.init_lock);
  while (kiln_pool.started + 1 < want) {
    int id = kiln_pool.started + 1;
    kiln_pool.mailbox[id].word = 0;
    kiln_pool.mailbox[id].sleepers = 0;
    /* Workers take no signals (they go to the application's threads) and get a main-sized
     * stack (musl's default of 128 KiB is small for kernels' stack buffers). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);
    int rc = pthread_create(&kiln_pool.threads[id], &attr, kiln_worker_main, (void*)(intptr_t)id);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) break;
    kiln_pool.started = id;
  }
  int have = kiln_pool.started + 1;
  pthread_mutex_unlock(&kiln_pool.init_lock);
  return have < want ? have : want;
}

static int kiln_run_serial(FTVMParallelLambda flambda, void* cdata) {
  TVMParallelGroupEnv env = {NULL, 1};
  int outer = kiln_in_task;
  kiln_in_task = 1;
  int rc = flambda(0, &env, cdata);
  kiln_in_task = outer;
  return rc;
}

/*
 * Run flambda(task_id, penv, cdata) for task_id in [0, num_task) (TVM's c_backend_api.h
 * contract): num_task <= 0 means one task per pool thread, and more than the team is capped
 * to it. The calling thread runs task 0. Serial (one task) when called from inside a task,
 * when another thread's launch holds the pool (a second model running concurrently gets no
 * worse than one thread instead of waiting), or when the team is one thread. If tasks fail,
 * the first failing task's message becomes the caller's error and -1 is returned.
 */
KILN_EXPORT int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  if (kiln_in_task || __atomic_load_n(&kiln_pool.team, __ATOMIC_RELAXED) == 1)
    return kiln_run_serial(flambda, cdata);
  if (pthread_mutex_trylock(&kiln_pool.lock) != 0) return kiln_run_serial(flambda, cdata);
  if (kiln_pool.team == 0) {
    const char* spin = getenv("KILN_SPIN_US");
    long us = spin != NULL && *spin != '\0' ? strtol(spin, NULL, 10) : KILN_SPIN_US;
    kiln_pool.spin_ns = (uint64_t)(us < 0 ? 0 : us > 1000000 ? 1000000 : us) * 1000u;
    __atomic_store_n(&kiln_pool.team, kiln_team_size(), __ATOMIC_RELAXED);
  }
  if (num_task <= 0 || num_task > kiln_pool.team) num_task = kiln_pool.team;
  if (num_task > 1) num_task = kiln_start_workers(num_task);
  if (num_task <= 1) {
    pthread_mutex_unlock(&kiln_pool.lock);
    return kiln_run_serial(flambda, cdata);
  }
  kiln_pool.flambda = flambda;
  kiln_pool.cdata = cdata;
  kiln_pool.num_task = num_task;
  kiln_pool.failed = 0;
  kiln_pool.barrier.arrived = 0;
  __atomic_store_n(&kiln_pool.pending.word, (uint32_t)(num_task - 1), __ATOMIC_SEQ_CST);
  for (int i = 1; i < num_task; ++i) {
    __atomic_store_n(&kiln_pool.mailbox[i].claim, 0, __ATOMIC_RELEASE); /* after the job */
    __atomic_fetch_add(&kiln_pool.mailbox[i].word, 1, __ATOMIC_SEQ_CST);
    kiln_publish(&kiln_pool.mailbox[i]);
  }
  TVMParallelGroupEnv env = {&kiln_pool.barrier, num_task};
  kiln_in_task = 1;
  if (flambda(0, &env, cdata) != 0) kiln_task_failed();
  /* Run the tasks of workers that have not started yet (descheduled by other processes, or
   * still waking up) instead of waiting for them, as onnxruntime's pool revokes unstarted
   * work. Safe with barriers: task 0 passes a barrier only when every task has arrived, so
   * if the lambda uses barriers, every task was claimed before task 0 could return. */
  for (int i = num_task - 1; i >= 1; --i)
    if (kiln_claim(i)) kiln_run_task(i);
  kiln_in_task = 0;
  kiln_wait(&kiln_pool.pending, kiln_is_zero, 0);
  int failed = (int)__atomic_load_n(&kiln_pool.failed, __ATOMIC_ACQUIRE);
  if (failed) TVMAPISetLastError(kiln_pool.message); /* into the caller's own buffer */
  pthread_mutex_unlock(&kiln_pool.lock);
  return failed ? -1 : 0;
}

/* Wait until all tasks of the launch arrive (TVM's TVMBackendParallelBarrier): the last one to
 * arrive resets the count and bumps the generation the others wait on (spin, then sleep). */
KILN_EXPORT int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  KilnBarrier* b = (KilnBarrier*)penv->sync_handle;
  if (b == NULL || penv->num_task <= 1) return 0;
  uint32_t gen = __atomic_load_n(&b->gen.word, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)penv->num_task) {
    __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->gen.word, gen + 1, __ATOMIC_SEQ_CST);
    kiln_publish(&b->gen);
  } else {
    kiln_wait(&b->gen, kiln_changed, gen);
  }
  return 0;
}

/* fork(): hold the launch lock across it, so no job is half-published; the child has none of
 * the parent's workers (fork copies only the calling thread) and starts its own on its first
 * launch. */
static void kiln_pool_prepare_fork(void) {
  pthread_mutex_lock(&kiln_pool.lock);
  pthread_mutex_lock(&kiln_pool.init_lock);
}

static void kiln_pool_parent_fork(void) {
  pthread_mutex_unlock(&kiln_pool.init_lock);
  pthread_mutex_unlock(&kiln_pool.lock);
}

static void kiln_pool_child_fork(void) {
  kiln_pool.started = 0;
  kiln_pool.team = 0; /* re-read KILN_NUM_THREADS and the affinity mask */
  for (int i = 0; i < KILN_MAX_THREADS; ++i) kiln_pool.mailbox[i].sleepers = 0;
  kiln_pool.pending.sleepers = 0;
  kiln_pool.barrier.gen.sleepers = 0;
  pthread_mutex_init(&kiln_pool.init_lock, NULL);
  pthread_mutex_init(&kiln_pool.lock, NULL);
}

__attribute__((constructor)) static void kiln_pool_init(void) {
  pthread_atfork(kiln_pool_prepare_fork, kiln_pool_parent_fork, kiln_pool_child_fork);
}

/* At exit or dlclose: stop the workers before their code is unmapped. */
__attribute__((destructor)) static void kiln_pool_fini(void) {
  if (kiln_in_task || pthread_mutex_trylock(&kiln_pool.lock) != 0) return; /* a launch runs */
  __atomic_store_n(&kiln_pool.shutdown, 1, __ATOMIC_SEQ_CST);
  for (int i = 1; i <= kiln_pool.started; ++i) {
    __atomic_fetch_add(&kiln_pool.mailbox[i].word, 1, __ATOMIC_SEQ_CST);
    kiln_publish(&kiln_pool.mailbox[i]);
  }
  for (int i = 1; i <= kiln_pool.started; ++i) pthread_join(kiln_pool.threads[i], NULL);
  kiln_pool.started = 0;
  __atomic_store_n(&kiln_pool.shutdown, 0, __ATOMIC_SEQ_CST); /* a later launch starts anew */
  pthread_mutex_unlock(&kiln_pool.lock);
}

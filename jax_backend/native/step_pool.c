/* A pool for the large working-memory blocks of the engine's CPU steps (jax_backend/step_pool.py).
 *
 * XLA's CPU runtime allocates a step's temporaries as one block per run (posix_memalign) and
 * frees it after the run. glibc serves a block over 32 MiB with a fresh mmap and unmaps it on
 * free, so every run zero-fills and faults its whole working set in again (benchmarks/
 * cpu_results.md, "Page faults"). This library keeps such blocks instead: the calls XLA's
 * library makes to posix_memalign and free (its GOT entries) are pointed here, and a block of
 * a size the engine registered (a compiled step's temp size) is cached when freed and handed
 * back to the next request of that size and alignment. Every other call goes straight to the
 * allocator that was there before. Blocks are real allocations of that allocator, so one freed
 * elsewhere is still valid; the pool only delays their release, at most `keep` per size.
 *
 * torch's CPU kernels run inside a step (ops/torch_kernels.py) allocate their outputs and
 * oneDNN's buffers through libc10.so, a few MiB each, in sizes that repeat every run; glibc
 * hands those back to the system as its heaps shrink and faults them in again the next run.
 * pool_keep_range(library, min, budget, keep) pools them too: it installs the pool for that
 * library (or moves an installed one's entries to the range hooks), and any block of at least
 * `min` bytes it requests is then cached by its exact size, at most `keep` per size and
 * `budget` bytes in all (one budget for every library with the rule).
 *
 * Entry points (ctypes): pool_install(path), pool_keep_range(path, min, budget, keep),
 * pool_uninstall(), pool_register(size, keep), pool_clear(), pool_stats(out[4]).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if __SIZEOF_POINTER__ == 8
#define RELOCATED_SYMBOL(info) ELF64_R_SYM(info)
#else
#define RELOCATED_SYMBOL(info) ELF32_R_SYM(info)
#endif

#define MAX_SIZES 16
#define MAX_BLOCKS 256
#define MAX_SLOTS 64
#define MAX_TARGETS 4

typedef int (*memalign_fn)(void **, size_t, size_t);
typedef void (*free_fn)(void *);

static memalign_fn real_memalign;
static free_fn real_free;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct pooled { size_t size; int keep; };
static struct pooled sizes[MAX_SIZES];
static _Atomic int n_sizes;          /* read without the lock on every posix_memalign */

/* The range rule for requests through the range hooks (pool_keep_range); the rule is read
 * without the lock on every such posix_memalign, the bytes cached under it with the lock. */
static _Atomic size_t range_min;
static _Atomic int range_keep;
static size_t range_budget, range_cached_bytes;

struct block { void *p; size_t size, align; int cached, by_range; };
static struct block blocks[MAX_BLOCKS];
static int n_blocks;
static _Atomic int n_tracked;        /* read without the lock on every free */
static long hits, misses, released;

/* The patched GOT slots, and what they held. */
struct slot { void **where; void *old; };
static struct slot slots[MAX_SLOTS];
static int n_slots;

/* The smallest size a tracked block can have: a free of anything smaller skips the lock. */
static _Atomic size_t min_tracked = SIZE_MAX;

static void lower_min_tracked(size_t size) {  /* with the lock held */
    if (size < atomic_load(&min_tracked)) atomic_store(&min_tracked, size);
}

static int registered_keep(size_t size) {
    int n = atomic_load(&n_sizes);
    for (int i = 0; i < n; i++)
        if (sizes[i].size == size) return sizes[i].keep;
    return 0;
}

/* How many blocks of `size` to keep: a registered size's count; else, for a request from a
 * library with a range rule, the rule's for a size in it. */
static int pooled_keep(size_t size, int by_range) {
    int keep = registered_keep(size);
    int range = atomic_load(&range_keep);
    if (keep == 0 && by_range && range && size >= atomic_load(&range_min)) return range;
    return keep;
}

static void forget(int i) {  /* with the lock held */
    if (blocks[i].cached && blocks[i].by_range) range_cached_bytes -= blocks[i].size;
    blocks[i] = blocks[--n_blocks];
    atomic_fetch_sub(&n_tracked, 1);
}

static int memalign_hook(void **out, size_t align, size_t size, int by_range) {
    if (size == 0 || !pooled_keep(size, by_range)) return real_memalign(out, align, size);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_blocks; i++) {
        if (blocks[i].cached && blocks[i].size == size && blocks[i].align == align) {
            blocks[i].cached = 0;
            if (blocks[i].by_range) range_cached_bytes -= size;
            hits++;
            *out = blocks[i].p;
            pthread_mutex_unlock(&lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&lock);
    int status = real_memalign(out, align, size);
    if (status != 0) return status;
    pthread_mutex_lock(&lock);
    misses++;
    /* An entry still naming this address was freed past the pool (its address is reused
     * now): forgotten, so that one address is never in the table twice. */
    for (int i = 0; i < n_blocks; i++)
        if (blocks[i].p == *out) {
            forget(i);
            break;
        }
    if (n_blocks < MAX_BLOCKS) {  /* else: the table is full, this block is glibc's alone */
        int by = by_range && !registered_keep(size);
        blocks[n_blocks++] = (struct block){*out, size, align, 0, by};
        atomic_fetch_add(&n_tracked, 1);
        lower_min_tracked(size);
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

/* One free for both kinds of hook: a block records whether the range rule pooled it. */
static void pool_free(void *p) {
    /* Untracked for sure (nothing tracked, or smaller than any tracked block): no lock. */
    if (p == NULL || atomic_load(&n_tracked) == 0 ||
        malloc_usable_size(p) < atomic_load(&min_tracked)) {
        real_free(p);
        return;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_blocks; i++) {
        if (blocks[i].p != p || blocks[i].cached) continue;
        size_t size = blocks[i].size;
        int keep = pooled_keep(size, blocks[i].by_range), cached = 0;
        for (int j = 0; j < n_blocks; j++)
            cached += blocks[j].cached && blocks[j].size == size;
        int fits = !blocks[i].by_range || range_cached_bytes + size <= range_budget;
        /* A block the allocator says is smaller than recorded is not the one handed out
         * (freed elsewhere, its address reused): forgotten, never handed out again. */
        if (cached < keep && fits && malloc_usable_size(p) >= size) {
            blocks[i].cached = 1;
            if (blocks[i].by_range) range_cached_bytes += size;
            pthread_mutex_unlock(&lock);
            return;
        }
        forget(i);
        released++;
        break;
    }
    pthread_mutex_unlock(&lock);
    real_free(p);
}

/* The posix_memalign a library's GOT points at: registered sizes only, or with the range
 * rule. */
static int pool_memalign(void **out, size_t align, size_t size) {
    return memalign_hook(out, align, size, 0);
}
static int range_memalign(void **out, size_t align, size_t size) {
    return memalign_hook(out, align, size, 1);
}

/* ------------------------------------------------------------------ the GOT of one library */
struct target { const char *path; uintptr_t base; const ElfW(Phdr) *phdr; int phnum; int found; };
/* The libraries patched (for uninstall's re-protection) and their names. */
static struct target installed[MAX_TARGETS];
static char installed_names[MAX_TARGETS][64];
static int installed_slots[MAX_TARGETS], installed_range[MAX_TARGETS];
static int n_installed;

static int find_library(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct target *t = data;
    const char *name = info->dlpi_name;
    size_t n = name ? strlen(name) : 0, m = strlen(t->path);
    /* `path` is a file name: the library loaded under any directory with that name. */
    if (n > m && name[n - m - 1] == '/' && strcmp(name + n - m, t->path) == 0) {
        t->base = info->dlpi_addr;
        t->phdr = info->dlpi_phdr;
        t->phnum = info->dlpi_phnum;
        t->found = 1;
        return 1;
    }
    return 0;
}

static uintptr_t absolute(uintptr_t base, uintptr_t value) {
    /* glibc relocates most d_ptr entries in place; other loaders leave them relative. */
    return value < base ? base + value : value;
}

static int write_slot(void **where, void *value) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)where & ~(uintptr_t)(page - 1);
    /* The GOT may sit in the RELRO segment, read-only after loading: opened for the write;
     * reprotect() closes the RELRO pages again (other pages were writable already). */
    if (mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE) != 0) return -1;
    *where = value;
    return 0;
}

static void reprotect(const struct target *t) {
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < t->phnum; i++) {
        if (t->phdr[i].p_type != PT_GNU_RELRO) continue;
        uintptr_t start = (t->base + t->phdr[i].p_vaddr) & ~(uintptr_t)(page - 1);
        uintptr_t end = t->base + t->phdr[i].p_vaddr + t->phdr[i].p_memsz;
        end &= ~(uintptr_t)(page - 1); /* as the loader does: the last partial page stays RW */
        if (end > start) mprotect((void *)start, end - start, PROT_READ);
    }
}

static void patch_relocations(const struct target *t, const ElfW(Rela) *rela, size_t bytes,
                              const ElfW(Sym) *symtab, const char *strtab, void *memalign_to) {
    for (size_t k = 0; k < bytes / sizeof(ElfW(Rela)); k++) {
        size_t sym = RELOCATED_SYMBOL(rela[k].r_info);
        if (sym == 0) continue;
        const char *name = strtab + symtab[sym].st_name;
        void *hook = strcmp(name, "posix_memalign") == 0 ? memalign_to
                   : strcmp(name, "free") == 0          ? (void *)pool_free
                                                        : NULL;
        if (hook == NULL || n_slots >= MAX_SLOTS) continue;
        void **where = (void **)(t->base + rela[k].r_offset);
        void *old = *where;
        if (old == pool_memalign || old == range_memalign || old == pool_free) {
            /* patched before (its original is in `slots`) */
            if (old != hook) write_slot(where, hook);
            continue;
        }
        if (write_slot(where, hook) == 0) slots[n_slots++] = (struct slot){where, old};
    }
}

/* A fork while another thread holds the lock would leave it held in the child for good. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }

static int install(const char *path, int by_range);

/* Points the posix_memalign and free of the loaded library named `path` (a file name, e.g.
 * libjax_common.so) at the pool; returns the number of GOT entries patched (0: none found,
 * nothing changed; -1: no such library loaded; -2: too many libraries). A library already
 * installed is left as it is (its count of entries returned). */
int pool_install(const char *path) { return install(path, 0); }

/* The same, with the range rule for that library's requests: blocks of at least `min` bytes
 * are cached by size, `keep` per size, `budget` bytes in all (for every such library). */
int pool_keep_range(const char *path, size_t min, size_t budget, int keep) {
    pthread_mutex_lock(&lock);
    atomic_store(&range_min, min);
    range_budget = budget;
    atomic_store(&range_keep, keep);
    lower_min_tracked(min);
    pthread_mutex_unlock(&lock);
    return install(path, 1);
}

static int install(const char *path, int by_range) {
    int index = -1;  /* a library installed before: left as it is, or given the range hooks */
    for (int i = 0; i < n_installed; i++)
        if (strcmp(installed_names[i], path) == 0) index = i;
    if (index >= 0 && (installed_range[index] || !by_range)) return installed_slots[index];
    if (index < 0 && (n_installed == MAX_TARGETS || strlen(path) >= sizeof installed_names[0]))
        return -2;
    static int fork_handlers;
    if (!fork_handlers++) pthread_atfork(before_fork, after_fork, after_fork);
    real_memalign = (memalign_fn)dlsym(RTLD_DEFAULT, "posix_memalign");
    real_free = (free_fn)dlsym(RTLD_DEFAULT, "free");
    if (!real_memalign || !real_free) return 0;
    struct target t = {path, 0, NULL, 0, 0};
    dl_iterate_phdr(find_library, &t);
    if (!t.found) return -1;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < t.phnum; i++)
        if (t.phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(t.base + t.phdr[i].p_vaddr);
    if (dyn == NULL) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmprel_bytes = 0, rela_bytes = 0;
    int rela_plt = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)absolute(t.base, dyn->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)absolute(t.base, dyn->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)absolute(t.base, dyn->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmprel_bytes = dyn->d_un.d_val; break;
        case DT_PLTREL: rela_plt = dyn->d_un.d_val == DT_RELA; break;
        case DT_RELA: rela = (const ElfW(Rela) *)absolute(t.base, dyn->d_un.d_ptr); break;
        case DT_RELASZ: rela_bytes = dyn->d_un.d_val; break;
        }
    }
    if (!symtab || !strtab) return 0;
    void *memalign_to = by_range ? (void *)range_memalign : (void *)pool_memalign;
    pthread_mutex_lock(&lock);
    if (n_installed == 0) hits = misses = released = 0;  /* counts since the first install */
    int first = n_slots;
    if (jmprel && rela_plt)
        patch_relocations(&t, jmprel, jmprel_bytes, symtab, strtab, memalign_to);
    if (rela) patch_relocations(&t, rela, rela_bytes, symtab, strtab, memalign_to);
    if (index >= 0) {  /* its entries already pointed at the pool: now at the range hooks */
        installed_range[index] = 1;
        reprotect(&t);
        pthread_mutex_unlock(&lock);
        return installed_slots[index];
    }
    int hooked_memalign = 0, hooked_free = 0;
    for (int i = first; i < n_slots; i++) {
        hooked_memalign |= *slots[i].where == memalign_to;
        hooked_free |= *slots[i].where == (void *)pool_free;
    }
    if (!(hooked_memalign && hooked_free)) { /* both or nothing */
        for (int i = first; i < n_slots; i++) *slots[i].where = slots[i].old;
        n_slots = first;
    }
    reprotect(&t);
    int patched = n_slots - first;
    if (patched) {
        installed[n_installed] = t;
        strcpy(installed_names[n_installed], path);
        installed[n_installed].path = installed_names[n_installed];
        installed_slots[n_installed] = patched;
        installed_range[n_installed] = by_range;
        n_installed++;
    }
    pthread_mutex_unlock(&lock);
    return patched;
}

static void release_cached(void) {  /* with the lock held */
    for (int i = n_blocks - 1; i >= 0; i--) {
        if (!blocks[i].cached) continue;
        void *p = blocks[i].p;
        forget(i);
        real_free(p);
        released++;
    }
}

/* Caches blocks of `size` bytes, at most `keep` of them (keep 0: no longer). */
int pool_register(size_t size, int keep) {
    pthread_mutex_lock(&lock);
    int n = atomic_load(&n_sizes), status = 0;
    int i = 0;
    while (i < n && sizes[i].size != size) i++;
    if (i == n) {
        if (n == MAX_SIZES) status = -1;
        else {
            sizes[n] = (struct pooled){size, keep};
            atomic_store(&n_sizes, n + 1);
        }
    } else {
        sizes[i].keep = keep;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

/* Frees every cached block and forgets every size and range rule (blocks in use are freed as
 * usual). */
void pool_clear(void) {
    pthread_mutex_lock(&lock);
    atomic_store(&n_sizes, 0);
    atomic_store(&range_keep, 0);
    release_cached();
    pthread_mutex_unlock(&lock);
}

/* Restores the GOT entries install patched, after clearing the pool. Blocks still in use
 * are forgotten too: their frees no longer pass through the pool, so their entries would only
 * go stale (an address glibc hands out again after a later install). */
void pool_uninstall(void) {
    pool_clear();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_slots; i++) write_slot(slots[i].where, slots[i].old);
    for (int i = 0; i < n_installed; i++) reprotect(&installed[i]);
    n_slots = 0;
    n_installed = 0;
    n_blocks = 0;
    range_cached_bytes = 0;
    atomic_store(&n_tracked, 0);
    atomic_store(&min_tracked, SIZE_MAX);
    pthread_mutex_unlock(&lock);
}

/* hits, misses, blocks released, cached blocks now. */
void pool_stats(long out[4]) {
    pthread_mutex_lock(&lock);
    long cached = 0;
    for (int i = 0; i < n_blocks; i++) cached += blocks[i].cached;
    out[0] = hits;
    out[1] = misses;
    out[2] = released;
    out[3] = cached;
    pthread_mutex_unlock(&lock);
}

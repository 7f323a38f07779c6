// Annotations for clang's thread-safety analysis (-Wthread-safety), as
// LevelDB's port/thread_annotations.h: which mutex guards a member, which
// functions need it held or take it. Under clang they become the
// attributes the analysis checks at compile time
// (scripts/thread_safety_check.sh fails on any warning); under other
// compilers they expand to nothing and cost nothing.
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html
//
// Members are grouped as LevelDB groups them: constant after
// construction; GUARDED_BY the mutex declared above them; owned by one
// thread (said in a comment). Memory that is safe by a protocol instead
// (written outside the lock by the one thread the protocol lets write it)
// carries no annotation and says so where it is declared.
#pragma once

#if defined(__clang__)
#define HERD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define HERD_THREAD_ANNOTATION(x)
#endif

// A type that is a mutex (common/mutex.h: Mutex).
#define CAPABILITY(x) HERD_THREAD_ANNOTATION(capability(x))
// A type whose objects hold a mutex for their lifetime (MutexLock).
#define SCOPED_CAPABILITY HERD_THREAD_ANNOTATION(scoped_lockable)

// A member read and written only with `x` held.
#define GUARDED_BY(x) HERD_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is read and written only with `x` held
// (the pointer itself is not guarded).
#define PT_GUARDED_BY(x) HERD_THREAD_ANNOTATION(pt_guarded_by(x))

// A function called with the mutexes held (and returning with them held).
#define REQUIRES(...) HERD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
// A function called without the mutexes held (it takes them itself).
#define LOCKS_EXCLUDED(...) HERD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes the mutexes (no argument: the object itself).
#define ACQUIRE(...) HERD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// A function that releases them.
#define RELEASE(...) HERD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// A function that checks (or merely states) that the caller holds them.
#define ASSERT_CAPABILITY(x) HERD_THREAD_ANNOTATION(assert_capability(x))

// A function the analysis does not check: its safety comes from something
// the analysis cannot follow; say what next to it.
#define NO_THREAD_SAFETY_ANALYSIS HERD_THREAD_ANNOTATION(no_thread_safety_analysis)

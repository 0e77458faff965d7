/* abi/rl/macros.h: export, calling-convention and language macros. */
#ifndef RL_MACROS_H
#define RL_MACROS_H

#if defined(_WIN32)
#define RL_EXPORT __declspec(dllexport)
#define RL_ABI __cdecl
#else
#define RL_EXPORT __attribute__((visibility("default")))
#define RL_ABI
#endif

/* RL_API marks functions exported by the runtime library (librl). Plugins never
 * need to link librl: everything a plugin may call reaches it through the host
 * services table (rl/host.h). */
#ifndef RL_API
#define RL_API RL_EXPORT
#endif

#ifdef __cplusplus
#define RL_EXTERN_C_BEGIN extern "C" {
#define RL_EXTERN_C_END }
#else
#define RL_EXTERN_C_BEGIN
#define RL_EXTERN_C_END
#endif

#endif /* RL_MACROS_H */

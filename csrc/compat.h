/* The oldest libcurl and jansson the native client builds against (Debian 11's:
 * libcurl 7.74.0, jansson 2.13.1), refused below that, and what newer versions
 * add. Every version test in csrc/ goes through a COS_HAVE_* name from here;
 * docs/native-client.md says what each one changes. */
#ifndef COS_COMPAT_H
#define COS_COMPAT_H

#include <curl/curlver.h>
#include <jansson.h>

#if LIBCURL_VERSION_NUM < 0x074A00
#error "the native client needs libcurl 7.74.0 or newer (curl/curlver.h is older)"
#endif
#if JANSSON_VERSION_HEX < 0x020D00
#error "the native client needs jansson 2.13 or newer (jansson.h is older)"
#endif

/* libcurl 7.87.0: CURLOPT_QUICK_EXIT. A transfer that ends while getaddrinfo
 * is stuck abandons the resolver thread; before, libcurl joins it and the I/O
 * thread waits for getaddrinfo to return. */
#define COS_HAVE_QUICK_EXIT (LIBCURL_VERSION_NUM >= 0x075700)
/* libcurl 7.85.0: CURLOPT_PROTOCOLS_STR (CURLOPT_PROTOCOLS is deprecated there). */
#define COS_HAVE_PROTOCOLS_STR (LIBCURL_VERSION_NUM >= 0x075500)
/* jansson 2.14: object keys of a given length (json_object_setn_new,
 * json_object_iter_key_len). Before, a key ends at its first NUL: a key holding
 * NUL cannot be sent, and is refused (ValueError) rather than cut. jansson's
 * parser refuses NUL in keys in both versions. */
#define COS_HAVE_JSON_KEYLEN (JANSSON_VERSION_HEX >= 0x020E00)

#endif

/* bind() for the local clusters of deploy/localcluster.py, loaded with LD_PRELOAD into the
 * processes that host Beam's gRPC servers (the job servers, Flink's TaskManagers, Spark's workers
 * and their executors).
 *
 * Beam 2.70's ServerFactory builds every gRPC server with NettyServerBuilder.forPort(port), which
 * listens on every interface whatever address it was given (--job-host included). Here a socket
 * bound to every interface (0.0.0.0, or :: for IPv6) is bound to the loopback address instead
 * (127.0.0.1, or ::ffff:127.0.0.1 so that IPv4 clients still reach an IPv6 socket); any other
 * bind is passed on unchanged. Built by localcluster.py with `cc -shared -fPIC`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind)
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in v4;
        memcpy(&v4, addr, sizeof v4);
        if (v4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&v4, sizeof v4);
        }
    }
    if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 v6;
        memcpy(&v6, addr, sizeof v6);
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) {
            static const unsigned char mapped_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
            memcpy(&v6.sin6_addr, mapped_loopback, sizeof mapped_loopback);
            return real_bind(fd, (const struct sockaddr *)&v6, sizeof v6);
        }
    }
    return real_bind(fd, addr, len);
}

/* A TCP echo over the loopback interface, IPv4 (127.0.0.1) then IPv6 (::1):
 * a forked child serves one connection and echoes what it reads; the parent
 * sends a line and prints what came back. Prints "tcp echo <address>: <line>"
 * for each, or the failing call. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int echo_over(int family, const char *address) {
    struct sockaddr_storage storage = {0};
    socklen_t length;
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&storage;
        in->sin_family = AF_INET;
        inet_pton(AF_INET, address, &in->sin_addr);
        length = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&storage;
        in6->sin6_family = AF_INET6;
        inet_pton(AF_INET6, address, &in6->sin6_addr);
        length = sizeof *in6;
    }
    int server = socket(family, SOCK_STREAM, 0);
    if (server < 0) { perror("socket"); return 1; }
    /* Port 0: the kernel picks one; getsockname says which. */
    if (bind(server, (struct sockaddr *)&storage, length) != 0) { perror("bind"); return 1; }
    if (listen(server, 1) != 0) { perror("listen"); return 1; }
    getsockname(server, (struct sockaddr *)&storage, &length);
    pid_t child = fork();
    if (child == 0) {
        int connection = accept(server, NULL, NULL);
        char buffer[128];
        ssize_t got = read(connection, buffer, sizeof buffer);
        _exit(got > 0 && write(connection, buffer, got) == got ? 0 : 2);
    }
    close(server);
    int client = socket(family, SOCK_STREAM, 0);
    if (connect(client, (struct sockaddr *)&storage, length) != 0) { perror("connect"); return 1; }
    const char line[] = "hello over loopback";
    if (write(client, line, sizeof line) != sizeof line) { perror("write"); return 1; }
    char echoed[128] = {0};
    ssize_t got = read(client, echoed, sizeof echoed - 1);
    int status;
    waitpid(child, &status, 0);
    printf("tcp echo %s: %s\n", address, got > 0 ? echoed : "(nothing)");
    return got == sizeof line && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(void) {
    return echo_over(AF_INET, "127.0.0.1") | echo_over(AF_INET6, "::1");
}

/* Where a short-lived process's resident memory is when it ends, for
 * comparing gpureap's peak memory with nvidia-smi's on a GPU host (issue 28,
 * docs/performance.md, "Memory of one command"): loaded with LD_PRELOAD, it appends one line per
 * process to the file named by $RSS_AT_EXIT_FILE at exit (a destructor, for
 * nvidia-smi) or at _exit (which gpureap ends with, and which runs no
 * destructor): VmHWM, VmRSS, RssAnon, RssFile from /proc/self/status, then the
 * resident KiB of each mapped file and of the anonymous mappings from
 * /proc/self/smaps, largest first.
 *
 *   cc -O2 -shared -fPIC -o rss_at_exit.so bench/rss_at_exit.c
 *   RSS_AT_EXIT_FILE=/tmp/rss LD_PRELOAD=$PWD/rss_at_exit.so nvidia-smi ... */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FILES 48

struct entry { char name[96]; long kib; };

static void status_field(const char *status, const char *key, char *out, size_t *used, size_t room) {
    const char *at = strstr(status, key);
    long value = -1;
    if (at) value = strtol(at + strlen(key), NULL, 10);
    *used += (size_t)snprintf(out + *used, room - *used, " %s%ld", key, value);
}

static void report(void) {
    static int done;
    const char *path = getenv("RSS_AT_EXIT_FILE");
    if (done || !path) return;
    done = 1;
    static char status[8192];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, status, sizeof status - 1);
    close(fd);
    if (n <= 0) return;
    status[n] = 0;
    static char line[8192];
    size_t used = 0;
    char comm[64] = "?";
    const char *name = strstr(status, "Name:");
    if (name) sscanf(name + 5, " %63s", comm);
    used += (size_t)snprintf(line, sizeof line, "%s pid=%d", comm, (int)getpid());
    const char *keys[] = {"VmHWM:", "VmRSS:", "RssAnon:", "RssFile:"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        status_field(status, keys[k], line, &used, sizeof line);

    static struct entry files[MAX_FILES];
    size_t count = 0;
    FILE *smaps = fopen("/proc/self/smaps", "re");
    if (smaps) {
        static char text[1024];
        struct entry *current = NULL;
        while (fgets(text, sizeof text, smaps)) {
            unsigned long start, end;
            long kib;
            if (sscanf(text, "%lx-%lx", &start, &end) == 2 && strchr(text, ' ')) {
                /* A mapping's first line: the name is the sixth field. */
                char mapped[96] = "[anon]";
                int fields = 0;
                char *p = text;
                while (*p && fields < 5) {
                    while (*p && *p != ' ') p++;
                    while (*p == ' ') p++;
                    fields++;
                }
                if (*p && *p != '\n') {
                    size_t len = strcspn(p, "\n");
                    const char *base = p;
                    for (size_t i = 0; i < len; i++)
                        if (p[i] == '/') base = p + i + 1;
                    len = strcspn(base, "\n");
                    if (len >= sizeof mapped) len = sizeof mapped - 1;
                    memcpy(mapped, base, len);
                    mapped[len] = 0;
                }
                current = NULL;
                for (size_t i = 0; i < count; i++)
                    if (strcmp(files[i].name, mapped) == 0) current = &files[i];
                if (!current && count < MAX_FILES) {
                    current = &files[count++];
                    strcpy(current->name, mapped);
                    current->kib = 0;
                }
            } else if (current && sscanf(text, "Rss: %ld kB", &kib) == 1) {
                current->kib += kib;
            }
        }
        fclose(smaps);
    }
    for (size_t shown = 0; shown < count; shown++) {
        size_t best = shown;
        for (size_t i = shown + 1; i < count; i++)
            if (files[i].kib > files[best].kib) best = i;
        struct entry swap = files[shown];
        files[shown] = files[best];
        files[best] = swap;
        if (files[shown].kib == 0) break;
        used += (size_t)snprintf(line + used, sizeof line - used, " %s=%ld", files[shown].name, files[shown].kib);
        if (used >= sizeof line - 1) break;
    }
    int out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) return;
    used = used < sizeof line - 1 ? used : sizeof line - 2;
    line[used++] = '\n';
    ssize_t written = write(out, line, used);
    (void)written;
    close(out);
}

__attribute__((destructor)) static void at_exit(void) { report(); }

void _exit(int status) {
    report();
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}

/* replay_main: runs a libFuzzer target over every file in a corpus folder,
 * so ordinary (gcc, ASan) test builds exercise the fuzz harnesses too. */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(buf, 1, (size_t)(n > 0 ? n : 0), f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            n_files++;
            if (replay_file(argv[i])) {
                return 1;
            }
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') {
                continue;
            }
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], de->d_name);
            n_files++;
            if (replay_file(path)) {
                closedir(d);
                return 1;
            }
        }
        if (d) {
            closedir(d);
        }
    }
    printf("replayed %d inputs\n", n_files);
    return n_files > 0 ? 0 : 1;
}

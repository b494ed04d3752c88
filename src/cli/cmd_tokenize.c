/* placeholder until the tokenize command lands (replaced in this session) */
#include <stdio.h>
#include "cmd.h"
int kg_cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kgen tokenize: not built yet\n");
    return 1;
}

/* placeholder until the generate command lands (replaced in this session) */
#include <stdio.h>
#include "cmd.h"
int kg_cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kgen generate: not built yet\n");
    return 1;
}

/* placeholder until the batch command lands (replaced in this session) */
#include <stdio.h>
#include "cmd.h"
int kg_cmd_batch(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kgen batch: not built yet\n");
    return 1;
}

/* cmd: the subcommands of the `kgen` program. Each returns the process
 * exit status (0 ok, 1 runtime failure, 2 usage error). */
#pragma once

#include "cli_util.h"

int kg_cmd_generate(int argc, char **argv);
int kg_cmd_tokenize(int argc, char **argv);
int kg_cmd_mkmodel(int argc, char **argv);
int kg_cmd_batch(int argc, char **argv);
int kg_cmd_render(int argc, char **argv);

// Declaration header written for this project (see ../../README.md); not Gloo's own header.
// ProcessGroupGloo.hpp includes it but uses nothing from it.
#pragma once
